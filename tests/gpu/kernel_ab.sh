#!/usr/bin/env bash
# A/B of kernel libraries on the GPU machine, in one call: the carried build ("new", from
# payload.tar.xz) against an older libsamplerd_capi.so ("old", kept by prepare_carry.sh in
# .carry/old/). Runs from the folder prepare_carry.sh assembles, like run_on_gpu.sh:
#
#   cd .carry/gpu_run && bash kernel_ab.sh --old ../old/libsamplerd_capi_<commit>.so.xz \
#       [--lib NAME=PATH ...] [--suites sampler,processors,statistics,session_kernels] [--reps 2]
#       [--bench "ARGS"] [--procs "ARGS"] [--ncu "CASE ..."] [--ncu-kernels REGEX]
#       [--ncu-source REGEX]
#
# In this order, each step optional and logged under $OUT (else ./ab_results):
#   suites   run_on_gpu.sh --no-bench --only LIST on the new build (suites.txt)
#   bench    bench_kernels.py --ours-only ARGS, old and new (and each --lib, a library of
#            another build, .so or .so.xz, NAME letters, digits, '.', '+' or '-') interleaved
#            --reps times (bench_{old,new,NAME}_N.json); ab.txt: per row the medians of each
#            side and each side / old
#   procs    bench_processors.py ARGS for old, new, new (procs_{old,new,new2}.json and .txt)
#   ncu      profile_cases.py CASE ... under Nsight Compute on the new build (SpeedOfLight,
#            LaunchStats, InstructionStats): ncu.txt, the duration, instructions and registers
#            of each profiled kernel; with --ncu-source, also SourceCounters and WarpStateStats,
#            and source_NAME.csv.xz for each |-separated NAME of REGEX: the executed instructions
#            and stall samples of every SASS line of that kernel (for a per-line diff)
# Each step has its own time limit, and the report is exported in small pieces, so that what
# ran comes back even when a later step runs out of time. Packs every result into
# 00_kernel_ab.tar.xz (the device tool returns 8 files at most) and prints a summary last.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {
  sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

OLD=""
SUITES=""
REPS=2
BENCH_ARGS=""
PROCS_ARGS=""
NCU_CASES=""
NCU_KERNELS="ChunkPass|RowFinish|Greedy|MassDraw"
NCU_SOURCE=""
EXTRA_NAMES=()
EXTRA_PATHS=()
while (($#)); do
  case "$1" in
    --old) OLD="$(realpath -m -- "${2-}")"; shift ;;
    --lib)
      spec="${2-}"
      name="${spec%%=*}"
      if [[ "$spec" != *=?* || ! "$name" =~ ^[A-Za-z0-9.+-]+$ || "$name" == old || "$name" == new ]]; then
        echo "kernel_ab.sh: --lib: expected NAME=PATH (NAME of letters, digits, '.', '+' or '-'," \
          "not old or new), got '$spec'" >&2
        exit 2
      fi
      EXTRA_NAMES+=("$name")
      EXTRA_PATHS+=("$(realpath -m -- "${spec#*=}")")
      shift ;;
    --suites) SUITES="${2-}"; shift ;;
    --reps) REPS="${2-}"; shift ;;
    --bench) BENCH_ARGS="${2-}"; shift ;;
    --procs) PROCS_ARGS="${2-}"; shift ;;
    --ncu) NCU_CASES="${2-}"; shift ;;
    --ncu-kernels) NCU_KERNELS="${2-}"; shift ;;
    --ncu-source) NCU_SOURCE="${2-}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "kernel_ab.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[[ "$REPS" =~ ^[1-9][0-9]*$ ]] || { echo "kernel_ab.sh: --reps: expected a count >= 1, got '$REPS'" >&2; exit 2; }
if [[ -n "$BENCH_ARGS$PROCS_ARGS" && -z "$OLD" ]]; then
  echo "kernel_ab.sh: --bench and --procs compare against --old LIB; none given" >&2
  exit 2
fi

cd "$HERE" || exit 2
RESULTS="${OUT:-$HERE/ab_results}"
mkdir -p "$RESULTS"
WORK="$(mktemp -d /tmp/kernel_ab.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
SUMMARY=()
note() { SUMMARY+=("$*"); echo "kernel_ab.sh: $*"; }

# The two libraries.
mkdir -p "$WORK/new" "$WORK/old"
tar -xJf "$HERE/payload.tar.xz" -C "$WORK/new" ./libsamplerd_capi.so ||
  { echo "kernel_ab.sh: no libsamplerd_capi.so in payload.tar.xz" >&2; exit 2; }
# unpack_lib SRC DIR: SRC (.so or .so.xz) as DIR/libsamplerd_capi.so.
unpack_lib() {
  mkdir -p "$2" &&
    case "$1" in
      *.xz) xz -dc "$1" >"$2/libsamplerd_capi.so" ;;
      *) cp "$1" "$2/libsamplerd_capi.so" ;;
    esac
}
if [[ -n "$OLD" ]]; then
  unpack_lib "$OLD" "$WORK/old" || { echo "kernel_ab.sh: cannot read --old $OLD" >&2; exit 2; }
fi
for i in "${!EXTRA_NAMES[@]}"; do
  unpack_lib "${EXTRA_PATHS[$i]}" "$WORK/${EXTRA_NAMES[$i]}" ||
    { echo "kernel_ab.sh: cannot read --lib ${EXTRA_NAMES[$i]}=${EXTRA_PATHS[$i]}" >&2; exit 2; }
  note "lib ${EXTRA_NAMES[$i]}: $(basename "${EXTRA_PATHS[$i]}")"
done
# An A/B is only as good as its base: name the old library's commit in the results. Session 25
# found that a hand-named "v30" base was a slow build of another tree (kernels/gpu/NOTES.md).
if [[ -n "$OLD" ]]; then
  old_name="$(basename "$OLD")"
  if [[ "$old_name" =~ ^libsamplerd_capi_[0-9a-f]{7,40}_ ]]; then
    note "old: $old_name"
  else
    note "old: $old_name (WARNING: not a clean commit's build as prepare_carry.sh names them," \
      "libsamplerd_capi_<commit>_<date>.so.xz: its kernels cannot be traced)"
  fi
fi
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if [[ -n "$SUITES" ]]; then
  mkdir -p "$WORK/suites"
  OUT="$WORK/suites" timeout 330 bash "$HERE/run_on_gpu.sh" --no-bench --only "$SUITES" \
    --deadline 320 >"$RESULTS/suites.txt" 2>&1
  note "suites ($SUITES): rc=$? ($(grep -c ' PASS ' "$RESULTS/suites.txt") PASS," \
    "$(grep -c ' FAIL ' "$RESULTS/suites.txt") FAIL lines)"
fi

if [[ -n "$BENCH_ARGS" ]]; then
  read -r -a bench_argv <<<"$BENCH_ARGS"
  for ((rep = 1; rep <= REPS; ++rep)); do
    for side in old new "${EXTRA_NAMES[@]}"; do
      timeout 150 python3 "$HERE/bench_kernels.py" --ours-only --lib "$WORK/$side/libsamplerd_capi.so" \
        "${bench_argv[@]}" --json "$RESULTS/bench_${side}_$rep.json" \
        >"$RESULTS/bench_${side}_$rep.txt" 2>&1 || note "bench $side $rep: rc=$?"
    done
  done
  python3 - "$RESULTS" old new "${EXTRA_NAMES[@]}" <<'PY' | tee "$RESULTS/ab.txt"
import glob, json, os, statistics, sys
results, sides = sys.argv[1], sys.argv[2:]
rows = {}
for path in sorted(glob.glob(os.path.join(results, "bench_*_*.json"))):
    side = os.path.basename(path)[len("bench_"):].rsplit("_", 1)[0]
    for r in json.load(open(path))["rows"]:
        key = (r["setting"], r["dtype"], r["dist"], r["batch"], r["vocab"])
        rows.setdefault(key, {}).setdefault(side, []).append(r["ours_us"])
others = sides[1:]
print(f"{'setting':<20} {'dtype':<5} {'dist':<7} {'B':>4} {'V':>7} {'old us':>8}"
      + "".join(f" {s + ' us':>10}" for s in others)
      + "".join(f" {s + '/old':>10}" for s in others))
for key, got in sorted(rows.items()):
    if "old" not in got or any(s not in got for s in others):
        continue
    med = {s: statistics.median(got[s]) for s in sides}
    print(f"{key[0]:<20} {key[1]:<5} {key[2]:<7} {key[3]:>4} {key[4]:>7} {med['old']:>8.1f}"
          + "".join(f" {med[s]:>10.1f}" for s in others)
          + "".join(f" {med[s] / med['old']:>10.3f}" for s in others))
PY
  note "bench: ab.txt (medians of $REPS runs a side)"
fi

if [[ -n "$PROCS_ARGS" ]]; then
  read -r -a procs_argv <<<"$PROCS_ARGS"
  for side in old new new2; do
    timeout 150 python3 "$HERE/bench_processors.py" --lib "$WORK/${side%2}/libsamplerd_capi.so" \
      "${procs_argv[@]}" --json "$RESULTS/procs_$side.json" >"$RESULTS/procs_$side.txt" 2>&1 ||
      note "procs $side: rc=$?"
  done
  note "procs: procs_{old,new,new2}.txt"
fi

if [[ -n "$NCU_CASES" ]]; then
  NCU="$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)"
  if [[ -z "$NCU" ]]; then
    note "ncu: not found"
  else
    read -r -a cases <<<"$NCU_CASES"
    sections=(--section SpeedOfLight --section LaunchStats --section InstructionStats)
    # The per-line counts and stall samples of the source page come from SourceCounters.
    # The shortest sampling interval (2^5 cycles): at the default, a 28 us launch at B = 1 gave
    # 152 samples in all, too few to split its one-block finish (session 25).
    [[ -n "$NCU_SOURCE" ]] &&
      sections+=(--section SourceCounters --section WarpStateStats --warp-sampling-interval 0)
    timeout 200 "$NCU" -f --profile-from-start off --clock-control none -k "regex:$NCU_KERNELS" \
      "${sections[@]}" -o "$WORK/prof" python3 "$HERE/profile_cases.py" --lib "$WORK/new/libsamplerd_capi.so" \
      "${cases[@]}" >"$RESULTS/ncu_log.txt" 2>&1
    note "ncu: rc=$?"
    timeout 60 "$NCU" -i "$WORK/prof.ncu-rep" --page details --csv 2>/dev/null |
      grep -E '"(Duration|Executed Instructions|Registers Per Thread)"' |
      awk -F'","' '{print $1 "\t" $5 "\t" $13 "\t" $15}' | tr -d '"' >"$RESULTS/ncu.txt"
    if [[ -n "$NCU_SOURCE" ]]; then
      # One export per kernel name (--ncu-source is a |-separated list of names): the SASS of
      # RowFinishKernel alone is ~200 MB of CSV and took more than 90 s to export in session 27,
      # which is likely why session 26's one export of several kernels came back empty.
      IFS='|' read -r -a source_kernels <<<"$NCU_SOURCE"
      for k in "${source_kernels[@]}"; do
        timeout 120 "$NCU" -i "$WORK/prof.ncu-rep" --page source --csv --print-source sass \
          -k "regex:$k" 2>"$RESULTS/source_${k}_err.txt" | xz -T0 >"$RESULTS/source_$k.csv.xz"
        note "ncu source ($k): rc=${PIPESTATUS[0]}, $(xz -dc "$RESULTS/source_$k.csv.xz" | wc -l)" \
          "lines; ncu said: $(head -c 300 "$RESULTS/source_${k}_err.txt" | tr '\n' ' ')"
      done
    fi
  fi
fi

# Everything in one archive too, named to sort first: the device tool brings back at most 8 files
# (session 17 lost the processors tables and the ncu source counts to that limit).
tar -cJf "$RESULTS/00_kernel_ab.tar.xz" -C "$RESULTS" --exclude 00_kernel_ab.tar.xz . 2>/dev/null &&
  note "all results: $RESULTS/00_kernel_ab.tar.xz"

echo
echo "==== kernel_ab.sh summary (results in $RESULTS) ===="
for line in "${SUMMARY[@]}"; do echo "  $line"; done
[[ -f "$RESULTS/ab.txt" ]] && cat "$RESULTS/ab.txt"
[[ -f "$RESULTS/ncu.txt" ]] && cat "$RESULTS/ncu.txt"
exit 0
