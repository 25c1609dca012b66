"""samplerd's load-and-faults program (issue 12, item 8): several client processes drive
SampleStream load against the real server (CPU backend) while faults are injected, and every
step, status and server resource is checked. Exits 1 when a check fails.

    /usr/bin/python3 tests/soak/soak.py [--streams 64 --steps 10000 ...]   (tests/soak/README.md)

Phases, in order:
  warm-up     the load's shape for --warmup_steps; then the baseline (RSS, threads, fds).
  load        --streams streams x --steps steps over --procs processes (each stream keeps
              --window steps in flight), while (a) a victim process is SIGKILLed mid-stream with
              steps in flight and (b) a regions process unregisters host shm regions while steps
              that name them are in flight. Then the server must return to the baseline.
  saturation  a second server with --max_inflight=--sat_limit: a burst of pipelined steps gets
              RESOURCE_EXHAUSTED ("server busy"), every step is answered, streams stay open,
              and the server serves again afterwards.
  drain       the load again, and SIGTERM: the server exits 0 within --grace_period + 1 s, and
              every step gets a reply (OK or UNAVAILABLE) or ends with its stream's error.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

import grpc

from soak_proc import Client, PeakSampler, Server, merge, percentile, snapshot

CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}
OK, NOT_FOUND, RESOURCE_EXHAUSTED, UNAVAILABLE = 0, 5, 8, 14


class Checks:
    def __init__(self) -> None:
        self.rows = []

    def expect(self, name: str, ok: bool, detail: str = "") -> None:
        self.rows.append((name, bool(ok), detail))
        print(f"  {'PASS' if ok else 'FAIL'}  {name}{'  (' + detail + ')' if detail else ''}",
              flush=True)

    def failed(self) -> list:
        return [r for r in self.rows if not r[1]]


def codes_text(codes: dict) -> str:
    return ", ".join(f"{CODE_NAMES.get(int(c), c)} {n}" for c, n in sorted(
        codes.items(), key=lambda kv: int(kv[0]))) or "none"


def check_steps(checks: Checks, label: str, r: dict, allowed_codes: set, allowed_ends: set) -> None:
    """The checks every phase's clients share: nothing lost or duplicated, order, content, codes."""
    checks.expect(f"{label}: every step answered once (or ended by its stream's error)",
                  r["lost"] == 0 and r["unknown"] == 0 and
                  r["sent"] == r["replies"] + r["ended_by_stream_error"],
                  f"sent {r['sent']}, replies {r['replies']}, lost {r['lost']}, unknown "
                  f"{r['unknown']}, ended by stream error {r['ended_by_stream_error']}")
    checks.expect(f"{label}: replies in order", r["out_of_order"] == 0,
                  f"out of order {r['out_of_order']}")
    checks.expect(f"{label}: every OK reply has its step's tokens", r["wrong_token"] == 0,
                  f"wrong {r['wrong_token']}")
    bad = {c: n for c, n in r["codes"].items() if int(c) not in allowed_codes}
    checks.expect(f"{label}: step statuses only {sorted(CODE_NAMES[c] for c in allowed_codes)}",
                  not bad, codes_text(r["codes"]))
    bad_ends = {e: n for e, n in r["stream_ends"].items() if e not in allowed_ends}
    checks.expect(f"{label}: streams end {sorted(allowed_ends)}", not bad_ends,
                  str(r["stream_ends"]))


def load_clients(args, tmp: str, target: str, mode: str, steps: int, tag: str) -> list:
    """--procs clients sharing --streams streams, stream ids distinct across all of them."""
    clients, first = [], 0
    for p in range(args.procs):
        n = args.streams // args.procs + (1 if p < args.streams % args.procs else 0)
        clients.append(Client(tmp, f"{tag}{p}", target, f"--mode={mode}", f"--streams={n}",
                              f"--steps={steps}", f"--window={args.window}",
                              f"--first_stream={first}", f"--batch={args.batch}",
                              f"--vocab={args.vocab}"))
        first += n
    return clients


def regions_client(args, tmp: str, target: str, name: str) -> Client:
    """A regions client that cycles until tmp/NAME.stop exists."""
    return Client(tmp, name, target, "--mode=regions", "--window=16",
                  f"--stop_file={tmp}/{name}.stop", f"--batch={args.batch}",
                  f"--vocab={args.vocab}")


def resources_line(label: str, s: dict) -> str:
    return (f"  {label:<14} RSS {s['rss_kib'] / 1024:7.1f} MiB  threads {s['threads']:3d} "
            f"({s['elastic_threads']} gRPC elastic)  fds {s['fds']:4d}  soak shm maps "
            f"{s['soak_maps']}")


def load_round(args, tmp: str, server: Server, checks: Checks, steps: int, tag: str) -> tuple:
    """The load's shape for `steps` steps a stream: --procs load clients, a regions client
    unregistering in flight, a victim SIGKILLed mid-stream. Checks each client's replies;
    returns (merged load results, regions results, the victim's steps, seconds)."""
    start = time.monotonic()
    clients = load_clients(args, tmp, server.target, "load", steps, tag)
    regions = regions_client(args, tmp, server.target, f"{tag}-regions")
    victim = Client(tmp, f"{tag}-victim", server.target, "--mode=victim", "--streams=2",
                    "--steps=0", "--window=16", "--first_stream=900000",
                    f"--batch={args.batch}", f"--vocab={args.vocab}")
    progressed = victim.wait_progress(args.victim_steps, timeout=60)
    victim.kill()
    checks.expect(f"{tag} victim: SIGKILLed mid-stream", progressed and victim.result is None,
                  f"after {victim.progress} steps on a stream, 16 in flight per stream")
    r = merge([c.wait(120 + args.streams * steps / 200) for c in clients])
    elapsed = time.monotonic() - start
    open(f"{tmp}/{tag}-regions.stop", "w").close()
    reg = regions.wait(60)
    check_steps(checks, tag, r, {OK}, {"OK"})
    checks.expect(f"{tag}: all steps sent", r["sent"] == args.streams * steps,
                  f"{r['sent']} of {args.streams * steps}")
    check_steps(checks, f"{tag} regions", reg, {OK, NOT_FOUND}, {"OK"})
    checks.expect(f"{tag} regions: unregistered with steps in flight",
                  reg["unregisters"] > 0 and reg["in_flight_at_unregister"] > 0,
                  f"{reg['unregisters']} unregisters, {reg['in_flight_at_unregister']} steps "
                  f"in flight at them")
    checks.expect(f"{tag} regions: no step sent after Unregister read the region",
                  reg["ok_after_unregister"] == 0, f"{reg['ok_after_unregister']} did")
    return r, reg, victim.progress, elapsed


def phase_load(args, tmp: str, checks: Checks, report: dict) -> Server:
    server = Server(args.bin, tmp, "main", f"--threads={args.threads}",
                    f"--grace_period={args.grace}s", f"--max_inflight={args.max_inflight}")
    before = snapshot(server.pid)
    # Every kind of traffic once, so that lazily made threads (the registry's closer) and
    # buffers exist before the baseline.
    print(f"== warm-up: the load's shape, {args.warmup_steps} steps a stream", flush=True)
    load_round(args, tmp, server, checks, args.warmup_steps, "warm-up")
    server.settle(snapshot(server.pid), seconds=1)
    time.sleep(0.5)
    baseline = snapshot(server.pid)

    print(f"== load: {args.streams} streams x {args.steps} steps, {args.procs} processes, "
          f"window {args.window}; a victim SIGKILLed; regions unregistered in flight", flush=True)
    with PeakSampler(server.pid) as peak:
        r, reg, victim_steps, elapsed = load_round(args, tmp, server, checks, args.steps, "load")

    after = server.settle(baseline)
    left = [n for n in server.regions() if n.startswith("soak-")]
    checks.expect("after: fds back to the baseline exactly", after["fds"] == baseline["fds"],
                  f"{baseline['fds']} -> {after['fds']}")
    fixed = [s["threads"] - s["elastic_threads"] for s in (baseline, after)]
    checks.expect("after: threads outside gRPC's elastic pools back to the baseline exactly",
                  fixed[1] == fixed[0], f"{fixed[0]} -> {fixed[1]}; by name "
                  f"{baseline['thread_names']} -> {after['thread_names']}")
    checks.expect(f"after: gRPC's elastic pool threads grew by at most {args.elastic_threads}",
                  after["elastic_threads"] <= baseline["elastic_threads"] + args.elastic_threads,
                  f"{baseline['elastic_threads']} -> {after['elastic_threads']}")
    rss_limit = baseline["rss_kib"] * (1 + args.rss_tolerance)
    checks.expect(f"after: RSS within {args.rss_tolerance:.0%} of the baseline",
                  after["rss_kib"] <= rss_limit,
                  f"{baseline['rss_kib']} -> {after['rss_kib']} KiB")
    checks.expect(f"load: peak RSS within {args.rss_tolerance:.0%} of the baseline (flat)",
                  peak.peak["rss_kib"] <= rss_limit,
                  f"peak {peak.peak['rss_kib']} KiB over {peak.samples} samples")
    checks.expect("after: no soak region registered or mapped",
                  not left and after["soak_maps"] == 0,
                  f"{len(left)} registered, {after['soak_maps']} mappings")

    rss_during = {f"{q:.0%}": peak.rss_at(q) for q in (0.1, 0.25, 0.5, 0.75, 1.0)}
    lat = r.pop("latencies_us")
    reg.pop("latencies_us")
    report.update(
        load={**r, "seconds": round(elapsed, 1), "steps_per_s": round(r["replies"] / elapsed),
              "p50_us": percentile(lat, 0.50), "p99_us": percentile(lat, 0.99),
              "max_us": max(lat) if lat else None},
        regions=reg, victim_steps=victim_steps,
        resources={"before": before, "baseline": baseline, "peak": peak.peak, "after": after,
                   "rss_kib_during_load": rss_during})
    print(f"  load: {r['replies']} replies in {elapsed:.1f} s ({report['load']['steps_per_s']}"
          f" steps/s); latency p50 {report['load']['p50_us']} µs, p99 "
          f"{report['load']['p99_us']} µs; errors: {codes_text(r['codes'])}")
    for label in ("before", "baseline", "peak", "after"):
        print(resources_line(label if label != "baseline" else "after warm-up",
                             report["resources"][label]))
    print("  RSS through the load (MiB): " + ", ".join(
        f"{k} {v / 1024:.1f}" for k, v in rss_during.items()))
    return server


def phase_saturation(args, tmp: str, checks: Checks, report: dict) -> None:
    print(f"== saturation: --max_inflight={args.sat_limit}, 4 streams x window 32", flush=True)
    server = Server(args.bin, tmp, "saturation", "--threads=1",
                    f"--max_inflight={args.sat_limit}", "--grace_period=2s")
    small = ["--batch=2", "--vocab=1024"]
    Client(tmp, "sat-warmup", server.target, "--streams=2", "--steps=20", "--window=1",
           *small).wait(60)
    baseline = server.settle(snapshot(server.pid), seconds=1)
    r = Client(tmp, "saturate", server.target, "--mode=saturate", "--streams=4",
               f"--steps={args.sat_steps}", "--window=32", "--batch=8",
               "--vocab=16384").wait(120)
    check_steps(checks, "saturation", r, {OK, RESOURCE_EXHAUSTED}, {"OK"})
    checks.expect("saturation: OK and RESOURCE_EXHAUSTED 'server busy' both seen, streams open",
                  r["codes"].get(str(RESOURCE_EXHAUSTED), 0) > 0 and
                  r["codes"].get(str(OK), 0) > 0 and r["busy_message_bad"] == 0,
                  codes_text(r["codes"]))
    rec = Client(tmp, "sat-recovery", server.target, "--streams=2", "--steps=20",
                 "--window=1", *small).wait(60)
    checks.expect("saturation: the server serves again afterwards",
                  rec["codes"] == {str(OK): 40}, codes_text(rec["codes"]))
    after = server.settle(baseline)
    checks.expect("saturation: fds back to the baseline", after["fds"] == baseline["fds"],
                  f"{baseline['fds']} -> {after['fds']}")
    rc, _ = server.terminate(timeout=10)
    checks.expect("saturation: server exits 0 on SIGTERM", rc == 0, f"exit {rc}")
    r.pop("latencies_us")
    report["saturation"] = r


def phase_drain(args, server: Server, tmp: str, checks: Checks, report: dict) -> None:
    print(f"== drain: SIGTERM under load (--grace_period={args.grace}s)", flush=True)
    clients = load_clients(args, tmp, server.target, "drain", 0, "drain")
    # Two streams that never half-close: gRPC cancels them 0.5 s after the grace period.
    clients.append(Client(tmp, "drain-hold", server.target, "--mode=drain", "--hold",
                          "--streams=2", "--steps=0", f"--window={args.window}",
                          "--first_stream=800000", f"--batch={args.batch}",
                          f"--vocab={args.vocab}"))
    for c in clients:
        c.wait_progress(100, timeout=60)
    in_flight = snapshot(server.pid)
    rc, elapsed = server.terminate(timeout=args.grace + 10)
    bound = args.grace + 1.0
    checks.expect(f"drain: exit 0 within grace + 1 s ({bound:.1f} s)",
                  rc == 0 and elapsed <= bound, f"exit {rc} after {elapsed:.2f} s")
    r = merge([c.wait(args.grace + 30) for c in clients])
    check_steps(checks, "drain", r, {OK, UNAVAILABLE}, {"OK", "UNAVAILABLE", "CANCELLED"})
    r.pop("latencies_us")
    report["drain"] = {**r, "exit_code": rc, "exit_seconds": round(elapsed, 2),
                       "threads_at_signal": in_flight["threads"]}
    print(f"  drain: exit {rc} after {elapsed:.2f} s; steps: {codes_text(r['codes'])}; "
          f"streams: {r['stream_ends']}; ended by stream error {r['ended_by_stream_error']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default=os.environ.get("SAMPLERD_BIN", os.path.join(
        os.path.dirname(__file__), "..", "..", "build", "default", "service", "samplerd")))
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--steps", type=int, default=10000, help="per stream")
    p.add_argument("--procs", type=int, default=8, help="client processes sharing the streams")
    p.add_argument("--window", type=int, default=2, help="steps in flight per stream")
    p.add_argument("--warmup_steps", type=int, default=0, help="default: steps / 20, >= 50")
    p.add_argument("--batch", type=int, default=2, help="rows per step")
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2, help="the server's --threads")
    p.add_argument("--max_inflight", type=int, default=256, help="the main server's")
    p.add_argument("--grace", type=float, default=2, help="the server's --grace_period, s")
    p.add_argument("--victim_steps", type=int, default=200)
    p.add_argument("--sat_limit", type=int, default=8)
    p.add_argument("--sat_steps", type=int, default=200, help="per saturating stream")
    p.add_argument("--rss_tolerance", type=float, default=0.10)
    p.add_argument("--elastic_threads", type=int, default=2 * (os.cpu_count() or 1),
                   help="growth allowed in gRPC's executor and timer threads (default: 2 per "
                   "core, the executor's own limit)")
    p.add_argument("--json", help="also write the numbers here")
    p.add_argument("--keep", action="store_true", help="keep the logs' folder")
    args = p.parse_args()
    args.warmup_steps = args.warmup_steps or max(50, args.steps // 20)
    if not os.access(args.bin, os.X_OK):
        print(f"error: no samplerd at {args.bin} (build it, or pass --bin / SAMPLERD_BIN)")
        return 2

    tmp = tempfile.mkdtemp(prefix="samplerd-soak.")
    checks, report = Checks(), {"args": vars(args)}
    server = None
    start = time.monotonic()
    try:
        server = phase_load(args, tmp, checks, report)
        phase_saturation(args, tmp, checks, report)
        phase_drain(args, server, tmp, checks, report)
    except RuntimeError as e:
        checks.expect("the soak ran to its end", False, str(e))
    finally:
        if server is not None and server.process.poll() is None:
            server.process.kill()
            server.process.wait()
    report["seconds"] = round(time.monotonic() - start, 1)
    report["failed"] = [r[0] for r in checks.failed()]
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    failed = checks.failed()
    print(f"soak: {len(checks.rows) - len(failed)} checks passed, {len(failed)} failed "
          f"in {report['seconds']} s")
    if failed and server is not None:
        print(f"main server log ({server.log_path}):\n{server.log_tail()}")
    if args.keep or failed:
        print(f"logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
