# shellcheck shell=bash
# The helpers of run_on_gpu.sh (sourced by it, never run): step bookkeeping (record, budget,
# run_step), the MPS daemon's stop, and waiting for a server. They read the run's globals:
# RESULTS, DEADLINE, START, MPS_DIR, MPS_CTL (set by run_on_gpu.sh before any is called).
# shellcheck disable=SC2154  # the globals above are assigned by run_on_gpu.sh

# --- step bookkeeping ---------------------------------------------------------------------------
NAMES=() RESULTS_OF=() SECONDS_OF=() NOTES=()
record() {  # record NAME PASS|FAIL SECONDS NOTE
  NAMES+=("$1") RESULTS_OF+=("$2") SECONDS_OF+=("$3") NOTES+=("$4")
  printf '==> %-20s %s  (%ss)%s\n' "$1" "$2" "$3" "${4:+  $4}"
}
# Seconds a step may take: its own limit, cut to what the deadline leaves (minus a reserve for
# stopping the servers and printing the summary).
budget() {
  local left=$((DEADLINE - (SECONDS - START) - 20))
  if ((left < $1)); then echo "$left"; else echo "$1"; fi
}
show_tail() {  # show_tail LOG LINES
  tail -n "$2" "$1" | awk '{ print "    | " $0 }'  # awk ends a cut-off last line
}

# run_step NAME LIMIT CMD...: runs CMD under `timeout`, output to $RESULTS/NAME.log. A GoogleTest
# binary that skips tests fails the step (on the GPU machine a skip means the GPU was not used).
run_step() {
  local name="$1" limit="$2" log="$RESULTS/$1.log" t0=$SECONDS rc note="" result=PASS
  shift 2
  limit="$(budget "$limit")"
  echo "--- $name: $*"
  if ((limit < 5)); then
    echo "not run: the --deadline leaves no time" >"$log"
    record "$name" FAIL 0 "not run: deadline reached"
    return
  fi
  # In the background with `wait`, so that a signal to this script is handled at once (cleanup
  # then stops the step).
  timeout -k 10 "$limit" "$@" >"$log" 2>&1 &
  STEP_PID=$!
  wait "$STEP_PID"
  rc=$?
  STEP_PID=""
  if ((rc == 124 || rc == 137)); then
    note="timed out after ${limit}s"
  elif ((rc != 0)); then
    note="exit code $rc"
  fi
  local skipped
  skipped="$(grep -Eo '^\[  SKIPPED \] [0-9]+ tests?,' "$log" | grep -Eo '[0-9]+' | head -n 1)"
  if [[ -n "$skipped" && "$skipped" != 0 ]]; then
    note="${note:+$note; }$skipped tests skipped"
    local why
    why="$(grep -v '^\[' "$log" | grep -m 1 -iE 'no GPU|not set' | cut -c1-160)"
    [[ -n "$why" ]] && note="$note ($why)"
  fi
  [[ -n "$note" ]] && result=FAIL
  local summary
  summary="$(grep -E '^(GPU|logprobs|stream|FAILED: )|mismatches' "$log" | tail -n 3)"
  [[ -n "$summary" ]] && printf '    | %s\n' "${summary//$'\n'/$'\n'    | }"
  if [[ "$result" == FAIL ]]; then
    show_tail "$log" 25
  else
    show_tail "$log" 3
  fi
  record "$name" "$result" $((SECONDS - t0)) "$note"
}

# --- MPS (--mps) ---------------------------------------------------------------------------------
# shellcheck disable=SC2317  # also invoked by the EXIT trap
stop_mps() {
  local pid="" waited=0
  [[ -f "$MPS_DIR/pipe/nvidia-cuda-mps-control.pid" ]] &&
    pid="$(tr -dc '0-9' <"$MPS_DIR/pipe/nvidia-cuda-mps-control.pid")"
  echo quit | "$MPS_CTL" >/dev/null 2>&1
  while ((waited < 100)); do  # tenths of a second: 10 s
    if [[ -n "$pid" ]]; then
      kill -0 "$pid" 2>/dev/null || break
    else
      [[ -e "$MPS_DIR/pipe/control" ]] || break
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  cat "$MPS_DIR"/log/*.log >"$RESULTS/mps_daemon.log" 2>/dev/null
  if ((waited >= 100)); then
    echo "run_on_gpu.sh: the MPS daemon${pid:+ (pid $pid)} did not quit within 10 s; left $MPS_DIR" >&2
  else
    rm -rf "$MPS_DIR"
  fi
  MPS_DIR=""
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

# --- servers -------------------------------------------------------------------------------------
# wait_ready NAME PID LOG: waits until the server logs "listening on" (it logs that after it
# reports SERVING) or exits; 0 when ready. Prints why not.
wait_ready() {
  local name="$1" pid="$2" log="$3" waited=0 rc
  while ((waited < 600)); do  # tenths of a second: 60 s
    if grep -q 'listening on' "$log" 2>/dev/null; then
      echo "$name: ready after $((waited / 10)).$((waited % 10))s (pid $pid)"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      rc=$?
      echo "$name: exited with code $rc before serving; its log:"
      sed -e 's/^/    /' "$log"
      return 1
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  echo "$name: not serving after 60 s (killed); its log:"
  kill -KILL "$pid" 2>/dev/null
  wait "$pid"
  sed -e 's/^/    /' "$log"
  return 1
}
