#!/usr/bin/env python3
"""Device sessions on the GPU machine: the Python client's sessions against a GPU server.

Every session token is checked against the same server's unary Sample of the same CUDA tensor
with the same parameters, seeds and positions. The GPU server's unary path runs the GPU plane's
kernels, so GPU-plane tokens must be identical; the host plane samples with the CPU fast
sampler, so greedy rows and row statuses must be identical and seeded rows >= 99.9% (every
mismatch is printed). Checks, each printed PASS/FAIL:

  eager        per plane: >= 1,000 fp32 steps and a bf16 run, B in 1..64, V = 151,936, random
               parameters per row (greedy rows included), parameters as lists and CUDA tensors
  auto         plane="auto": the plane it picks, tokens equal to unary
  closed       open_sessions back to 0 after close()
  graph        per plane: torch.cuda.graph capture of a stand-in forward (writes the logits) +
               the session step, replayed >= 200 times with new inputs, parameters and positions
  invalid      per plane: an invalid parameter row mid-batch: status 4, token -1, neighbours
               equal to unary
  concurrent   per plane: two sessions stepped from two threads (own streams) at once
  processors   per plane: a session with a token bitmask and a processors buffer (logit bias,
               penalties, token histories): eager steps and a CUDA graph per B (bitmask and
               packed processors as fixed CUDA tensors), tokens and statuses equal to unary with
               the same processors; masked rows keep allowed tokens, empty masks give status 5;
               a bad processor row (each rule) gets status 4, its neighbours equal to unary
  engine_kill  per plane: an engine process SIGKILLed while its stream waits mid-session: the
               server stays SERVING (grpc.health.v1), open_sessions returns to 0 within 2 s, the
               server's GPU memory (nvidia-smi) returns to its baseline, a new session works
  server_kill  per plane: a dedicated server (--samplerd) SIGKILLed while the engine's stream
               waits: the stream completes and the next sample() raises, each within 1 s
  bench        per plane, B in 1, 32, 128: median / p90 of a session step on the engine's stream
               (CUDA events, 300 steps) against the bare kernel time (libsamplerd_capi.so
               through bench_kernels.py, --capi) and the server's compute time of unary calls;
               a markdown table on stdout and in --results (device_session_bench.{md,json})
  processors_bench  GPU plane, B in 1, 32, 128: the step without processors, with a half-dense
               bitmask, and with the bitmask + 16 bias and 2,000 history entries per row
               (--results: processors_bench.{md,json})

    python3 device_session_cuda.py --gpu unix:///tmp/g.sock --py DIR [--samplerd BIN
        --lib-dir DIR] [--server-pid PID] [--capi libsamplerd_capi.so] [--results DIR]

DIR holds the `samplerd` package with its generated stubs (prepare_carry.sh puts it in ./py).
Exit status 0 when every check passed.
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules below

from session_checks_bench import check_bench  # noqa: E402
from session_checks_correctness import (check_auto, check_closed, check_concurrent,  # noqa: E402
                                        check_eager, check_graph, check_invalid)
from session_bench_processors import check_processors_bench  # noqa: E402
from session_checks_processors import check_processors  # noqa: E402
from session_checks_kill import (check_engine_kill, check_server_kill, engine_child,  # noqa: E402
                                 server_kill_child)
from session_common import CHECKS, DEADLINE, PLANES, RESULTS, check, guarded  # noqa: E402


# --- main ---------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True, help="the GPU server's target")
    ap.add_argument("--py", required=True, help="folder holding the samplerd package")
    ap.add_argument("--samplerd", help="the samplerd binary (server_kill starts its own server)")
    ap.add_argument("--lib-dir", help="LD_LIBRARY_PATH for --samplerd")
    ap.add_argument("--server-pid", type=int, default=0,
                    help="the GPU server's pid, for its GPU memory in nvidia-smi")
    ap.add_argument("--capi", help="libsamplerd_capi.so, for the bare kernel time in the benchmark")
    ap.add_argument("--results", default="", help="folder for the benchmark's JSON and markdown")
    ap.add_argument("--planes", default="gpu,host")
    ap.add_argument("--checks", default=",".join(CHECKS), help="subset of " + ",".join(CHECKS))
    ap.add_argument("--steps", type=int, default=1000, help="fp32 eager steps per plane")
    ap.add_argument("--eager-seconds", type=float, default=45,
                    help="time budget of each eager run (fewer steps fail the step-count check)")
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds the whole run may take; later checks are not run (FAIL) "
                         "when less than 15 s are left (0: no limit)")
    ap.add_argument("--bf16-steps", type=int, default=300, help="bf16 eager steps per plane")
    ap.add_argument("--graph-replays", type=int, default=210)
    ap.add_argument("--concurrent-steps", type=int, default=150)
    ap.add_argument("--bench-steps", type=int, default=300)
    ap.add_argument("--bench-batches", default="1,32,128")
    ap.add_argument("--memory-slack-mib", type=int, default=2)
    ap.add_argument("--memory-wait", type=float, default=5.0)
    ap.add_argument("--expect-mps", action="store_true",
                    help="the server must report that it runs under MPS")
    ap.add_argument("--quick", action="store_true", help="fewer steps everywhere")
    ap.add_argument("--engine-child", choices=PLANES, help=argparse.SUPPRESS)
    ap.add_argument("--server-kill-child", choices=PLANES, help=argparse.SUPPRESS)
    ap.add_argument("--child-target", help=argparse.SUPPRESS)
    ap.add_argument("--child-server-pid", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, args.py)
    import samplerd

    if args.engine_child:
        return engine_child(args, samplerd, args.engine_child)
    if args.server_kill_child:
        return server_kill_child(args, samplerd, args.server_kill_child)

    if args.quick:
        args.steps, args.bf16_steps, args.graph_replays = 200, 64, 60
        args.concurrent_steps, args.bench_steps = 40, 100
    args.planes = [p for p in args.planes.split(",") if p]
    checks = set(args.checks.split(","))
    unknown = checks - set(CHECKS)
    if unknown or any(p not in PLANES for p in args.planes):
        ap.error("expected --checks from %s and --planes from %s, got %s / %s"
                 % (CHECKS, PLANES, sorted(unknown), args.planes))
    if args.results:
        os.makedirs(args.results, exist_ok=True)
    if args.deadline > 0:
        DEADLINE[0] = time.monotonic() + args.deadline
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    client = samplerd.Client(args.gpu, timeout=60, cuda_ipc="always")
    info = client.server_info()
    support = info.device_sessions
    print("device %s, torch %s, samplerd %s, backend %d; device sessions: gpu_plane %s, "
          "host_plane %s, mps %s, open %d, max %d"
          % (torch.cuda.get_device_name(device), torch.__version__, info.version, info.backend,
             support.gpu_plane, support.host_plane, support.mps, support.open_sessions,
             info.limits.max_device_sessions), flush=True)
    check(support.gpu_plane and support.host_plane,
          "server_info: the GPU server serves both planes",
          "gpu_plane %s, host_plane %s" % (support.gpu_plane, support.host_plane))
    if args.expect_mps:
        check(support.mps, "server_info: the server reports MPS (--expect-mps)",
              "mps %s, CUDA_MPS_PIPE_DIRECTORY %s" % (support.mps,
                                                      os.environ.get("CUDA_MPS_PIPE_DIRECTORY")))

    for plane in args.planes:
        if "eager" in checks:
            guarded("eager %s" % plane, check_eager, client, args, plane, device)
    if "auto" in checks:
        guarded("auto", check_auto, client, args, device)
    if "closed" in checks:
        guarded("closed", check_closed, client, args, device)
    for plane in args.planes:
        if "graph" in checks:
            guarded("graph %s" % plane, check_graph, client, args, plane, device)
        if "invalid" in checks:
            guarded("invalid %s" % plane, check_invalid, client, args, plane, device)
        if "concurrent" in checks:
            guarded("concurrent %s" % plane, check_concurrent, client, args, plane, device)
        if "processors" in checks:
            guarded("processors %s" % plane, check_processors, client, args, plane, device)
    for plane in args.planes:
        if "engine_kill" in checks:
            guarded("engine_kill %s" % plane, check_engine_kill, client, args, plane, device)
        if "server_kill" in checks:
            guarded("server_kill %s" % plane, check_server_kill, client, args, plane, device)
    if "bench" in checks:
        guarded("bench", check_bench, client, args, device)
    if "processors_bench" in checks and "gpu" in args.planes:
        guarded("processors_bench", check_processors_bench, client, args, device)
    client.close()

    failed = [(name, detail) for name, ok, detail in RESULTS if not ok]
    print("\n==== device_session_cuda.py: %d checks, %d passed, %d failed ===="
          % (len(RESULTS), len(RESULTS) - len(failed), len(failed)))
    for name, detail in failed:
        print("FAILED: %s  (%s)" % (name, detail))
    print("all checks passed" if not failed and RESULTS else "%d check(s) failed" % len(failed),
          flush=True)
    return 0 if RESULTS and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
