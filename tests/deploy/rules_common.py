"""What the deploy rules share: paths, the failure type, and reading samplerd's flags."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Broken(Exception):
    """A rule does not hold; the message says what was expected and what was found."""


def expect(condition, message):
    if not condition:
        raise Broken(message)


def parse_flags(args):
    """--name=value args as a dict; any other form is refused (the rules read values)."""
    flags = {}
    for arg in args:
        match = re.fullmatch(r"--([a-z_]+)=(.*)", arg)
        expect(match, f"expected samplerd args as --flag=value, got {arg!r}")
        flags[match.group(1)] = match.group(2)
    return flags
