#!/usr/bin/env bash
# The watchdog (host/watchdog.h), through the real program: one of 2 ranks is stopped with SIGSTOP (as
# a hung GPU or a stalled file system would stop it); the other waits in a collective. With
# --collective-timeout 3, every process of the job exits, non-zero, within the timeout plus 10 s, and
# stderr names the rank and the operation it waited in.
# Usage: test_watchdog.sh TRAIN_BINARY "MPIRUN..."
set -euo pipefail
bin=$(realpath "$1")
mpirun=${2:-mpirun --allow-run-as-root --oversubscribe}
dir=$(mktemp -d)
cleanup() {
    pkill -9 -f -- "-o $dir/run" 2>/dev/null || true
    kill -9 $(jobs -p) 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
python3 "$(dirname "$0")/make_shards.py" "$dir" 2 20000
$mpirun -np 2 "$bin" -e tiny -b 2 -t 32 -x 100000 -v 0 -s 0 --collective-timeout 3 -i "$dir/train_*.bin" \
    -j "$dir/val_*.bin" -o "$dir/run" > "$dir/log" 2> "$dir/err" &
job=$!
for _ in $(seq 600); do grep -q "^step 2/" "$dir/log" 2>/dev/null && break; sleep 0.1; done
grep -q "^step 2/" "$dir/log" || { echo "watchdog: the run never reached step 2"; cat "$dir/err"; exit 1; }
rank=$(pgrep -f -- "-o $dir/run" | grep -v "^$job\$" | tail -1)
kill -STOP "$rank"
stopped=$(date +%s)
for _ in $(seq 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then echo "watchdog: the job still runs 30 s after a rank stopped"; cat "$dir/err"; exit 1; fi
status=0
wait "$job" || status=$?
elapsed=$(( $(date +%s) - stopped ))
test "$status" -ne 0 || { echo "watchdog: the job exited 0"; exit 1; }
test "$elapsed" -le 13 || { echo "watchdog: the job took $elapsed s to end (timeout 3 s + 10 s)"; exit 1; }
grep -q "rank [01]: watchdog: no progress for [0-9]* s (--collective-timeout 3) in a training step, step [0-9]*" "$dir/err" ||
    { echo "watchdog: no message naming the rank and the operation"; cat "$dir/err"; exit 1; }
sleep 1
left=$(pgrep -f -- "-o $dir/run" || true)
test -z "$left" || { echo "watchdog: processes left behind: $left"; exit 1; }
echo "watchdog: a stopped rank ended the 2-rank job in $elapsed s (status $status): $(grep -o 'rank [01]: watchdog: [^:]*' "$dir/err" | head -1)"
