"""Builds the `samplerd` package; the stubs (samplerd/v1) are generated first when missing.

    /usr/bin/python3 -m pip install --no-build-isolation client/python

Generation needs the repository's proto/ folder, protoc and grpc_python_plugin (generate.sh).
"""

import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithStubs(build_py):
    def run(self):
        if not os.path.exists(os.path.join(HERE, "samplerd", "v1", "sampler_pb2.py")):
            subprocess.check_call(["bash", os.path.join(HERE, "generate.sh")])
        super().run()


setup(cmdclass={"build_py": BuildWithStubs})
