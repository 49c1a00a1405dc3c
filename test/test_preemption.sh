#!/usr/bin/env bash
# Preemption (host/preemption.h), through the real program: (1) SIGTERM to a single-rank run: it
# finishes its step, writes that step's checkpoint and exits with 75; -y resumes there. (2) SIGUSR1 to
# mpirun, through scripts/run_gpt2.sh on 2 ranks: mpirun forwards it, both ranks stop after the same
# step with one checkpoint, and run_gpt2.sh ends with 75 instead of retrying. (3) Without -o: 75, and
# the message says no checkpoint was written.
# Usage: test_preemption.sh TRAIN_BINARY "MPIRUN..."
set -euo pipefail
bin=$(realpath "$1")
mpirun=${2:-mpirun --allow-run-as-root --oversubscribe}
here=$(dirname "$0")
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
python3 "$here/make_shards.py" "$dir" 4 20000
common=(-e tiny -b 2 -t 32 -k constant -v 0 -s 0 -i "$dir/train_*.bin" -j "$dir/val_*.bin")

# Sets $status to the exit status of background job $1, which must end within 60 s of the signal (else
# it is killed). Not a command substitution: only this shell can wait for its jobs.
wait_exit() {
    for _ in $(seq 600); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$1" 2>/dev/null; then
        pkill -KILL -P "$1" 2>/dev/null || true
        kill -KILL "$1" 2>/dev/null || true
        echo "preemption: still running 60 s after the signal" >&2
    fi
    status=0
    wait "$1" || status=$?
}

# Waits (at most 60 s) until $1 shows step 2 done.
wait_for_step() {
    for _ in $(seq 600); do grep -q "^step 2/" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "preemption: the run never reached step 2"; cat "$1"; exit 1
}

# (1) SIGTERM, one rank
"$bin" "${common[@]}" -x 100000 -o "$dir/one" > "$dir/one.log" 2> "$dir/one.err" &
pid=$!
wait_for_step "$dir/one.log"
kill -TERM "$pid"
wait_exit "$pid"
test "$status" -eq 75 || { echo "SIGTERM: exit status $status, expected 75"; cat "$dir/one.err"; exit 1; }
step=$(sed -n 's/.*SIGTERM: stopped after step \([0-9]*\), its checkpoint is written; exit status 75.*/\1/p' "$dir/one.err")
test -n "$step" || { echo "SIGTERM: no message naming the step"; cat "$dir/one.err"; exit 1; }
test -e "$dir/one/state_$(printf %08d "$step").bin.done" || { echo "SIGTERM: no complete checkpoint at step $step"; exit 1; }
"$bin" "${common[@]}" -x $((step + 2)) -o "$dir/one" -y > "$dir/resumed.log"
grep -q "resumed at step $step" "$dir/resumed.log" || { echo "-y did not resume at step $step"; cat "$dir/resumed.log"; exit 1; }
echo "preemption: SIGTERM stopped one rank after step $step with its checkpoint (exit 75); -y resumed there"

# (2) SIGUSR1 to mpirun under scripts/run_gpt2.sh, 2 ranks
NGPU=2 LAUNCHER=mpirun TRAIN_GPT="$bin" TRAIN_DATA="$dir/train_*.bin" VAL_DATA="$dir/val_*.bin" MAX_TRIES=1 \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    "$here/../scripts/run_gpt2.sh" "$dir/two" -e tiny -b 2 -t 32 -k constant -v 0 -s 0 -x 100000 \
    > "$dir/two.log" 2> "$dir/two.err" &
script=$!
wait_for_step "$dir/two.log"
pkill -USR1 -P "$script" -x mpirun
wait_exit "$script"
test "$status" -eq 75 || { echo "run_gpt2.sh: exit status $status, expected 75"; cat "$dir/two.err"; exit 1; }
grep -q "SIGUSR1: stopped after step" "$dir/two.err" || { echo "SIGUSR1: no stop message"; cat "$dir/two.err"; exit 1; }
grep -q "run_gpt2.sh: preempted" "$dir/two.err" || { echo "run_gpt2.sh did not report the preemption"; exit 1; }
count=$(ls "$dir"/two/state_*.bin.done | wc -l)
test "$count" -eq 1 || { echo "SIGUSR1: expected one checkpoint, found $count"; ls "$dir/two"; exit 1; }
echo "preemption: SIGUSR1 through mpirun stopped 2 ranks after one step with one checkpoint; run_gpt2.sh exited 75"

# (3) no -o
"$bin" "${common[@]}" -x 100000 > "$dir/none.log" 2> "$dir/none.err" &
pid=$!
wait_for_step "$dir/none.log"
kill -USR1 "$pid"
wait_exit "$pid"
test "$status" -eq 75 || { echo "without -o: exit status $status, expected 75"; exit 1; }
grep -q "no checkpoint (no -o)" "$dir/none.err" || { echo "without -o: the message does not say so"; cat "$dir/none.err"; exit 1; }
echo "preemption: without -o, exit 75 saying no checkpoint was written"
