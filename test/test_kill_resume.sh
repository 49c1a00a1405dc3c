#!/usr/bin/env bash
# kill -9 at random moments (random points in the run's progress), then -y, until the run completes: the
# final model and training state are byte for byte those of an uninterrupted run. A checkpoint every step
# makes some kills land inside a checkpoint write (counted from the temp files they leave). (1) one rank;
# (2) 2 ranks at ZeRO-1 under mpirun, one rank killed (mpirun then ends the job). Kill times come from a
# fixed seed.
# Usage: test_kill_resume.sh TRAIN_BINARY "MPIRUN..."
set -euo pipefail
bin=$(realpath "$1")
mpirun=${2:-mpirun --allow-run-as-root --oversubscribe}
dir=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
python3 "$(dirname "$0")/make_shards.py" "$dir" 8 20000
common=(-e tiny -b 2 -t 32 -d 128 -x 8 -n 1 --keep-last 2 -k constant -v 0 -s 0 -i "$dir/train_*.bin" -j "$dir/val_*.bin")
RANDOM=42

# The state without its run metadata (run id, settings): step, RNG, loader position, master, moments.
same_state() {
    python3 - "$1" "$2" <<'PY'
import struct, sys
def content(path):
    data = open(path, "rb").read()
    slot = struct.unpack_from("<256Q", data)
    return slot[3:12], data[slot[14]:slot[17]]
assert content(sys.argv[1]) == content(sys.argv[2]), "the state differs from the uninterrupted run's"
PY
}

# The newest step with a complete checkpoint in $1 (0 if none).
newest_done() {
    local newest=0 marker step
    for marker in "$1"/state_*.bin.done; do
        [ -e "$marker" ] || continue
        step=${marker##*/state_}; step=$((10#${step%%.*}))
        [ "$step" -gt "$newest" ] && newest=$step
    done
    echo "$newest"
}

# Runs "$@" with -o $1 again and again until one attempt completes; -y whenever a complete checkpoint
# exists. While fewer than $kill_before steps are checkpointed, an attempt is killed with -9 a random
# 0-0.3 s (about one step and its checkpoint write) after it checkpoints its first new step. Kills follow
# progress, not the clock, so a slow or loaded machine gets the same number of kills: each attempt moves
# at most 2 steps, so steps 0..6 take at least 3 kills. Prints kills and kills during a checkpoint write.
run_until_done() {
    local out=$1 kill_rank=$2 kill_before=6; shift 2
    local kills=0 in_write=0
    for attempt in $(seq 1 100); do
        local resume=() start
        start=$(newest_done "$out")
        [ "$start" -gt 0 ] && resume=(-y)
        "$@" -o "$out" "${resume[@]}" > "$out.log" 2>&1 &
        local job=$!
        if [ "$start" -lt "$kill_before" ]; then
            while kill -0 "$job" 2>/dev/null && [ "$(newest_done "$out")" -le "$start" ]; do sleep 0.02; done
            kill -0 "$job" 2>/dev/null && sleep "0.$(printf %03d $((RANDOM % 300)))"
        fi
        if [ "$start" -ge "$kill_before" ] || ! kill -0 "$job" 2>/dev/null; then
            local status=0
            wait "$job" || status=$?
            test "$status" -eq 0 || { echo "kill-resume: attempt $attempt failed ($status)"; cat "$out.log"; exit 1; }
            echo "$kills $in_write"
            return
        fi
        if [ "$kill_rank" = process ]; then
            kill -9 "$job"
        else  # one rank of the job (mpirun's child); mpirun then ends the other
            local rank_pid
            rank_pid=$(pgrep -P "$job" -f train_gpt | head -1 || true)
            kill -9 "${rank_pid:-$job}" 2> /dev/null || true
        fi
        wait "$job" 2> /dev/null || true
        kills=$((kills + 1))
        ls "$out"/*.tmp > /dev/null 2>&1 && in_write=$((in_write + 1))
    done
    echo "kill-resume: no attempt completed in 100"; exit 1
}

"$bin" "${common[@]}" -o "$dir/straight" > "$dir/straight.log"
read -r kills in_write < <(run_until_done "$dir/one" process "$bin" "${common[@]}")
cmp "$dir/straight/model_00000008.bin" "$dir/one/model_00000008.bin" || { echo "kill-resume: the model differs"; exit 1; }
same_state "$dir/straight/state_00000008.bin" "$dir/one/state_00000008.bin"
test "$kills" -ge 3 || { echo "kill-resume: only $kills kills: the test did not interrupt enough"; exit 1; }
echo "kill-resume: 1 rank, $kills kills ($in_write during a checkpoint write): final model and state byte for byte"

# 2 ranks at ZeRO-1 (the same global batch: -d 128 = 2 ranks x B 2 x T 32): bitwise its own uninterrupted twin.
$mpirun -np 2 "$bin" "${common[@]}" -z 1 -o "$dir/straight2" > "$dir/straight2.log"
read -r kills in_write < <(run_until_done "$dir/two" rank $mpirun -np 2 "$bin" "${common[@]}" -z 1)
cmp "$dir/straight2/model_00000008.bin" "$dir/two/model_00000008.bin" || { echo "kill-resume: 2 ranks: the model differs"; exit 1; }
same_state "$dir/straight2/state_00000008.bin" "$dir/two/state_00000008.bin"
test "$kills" -ge 3 || { echo "kill-resume: 2 ranks: only $kills kills"; exit 1; }
echo "kill-resume: 2 ranks ZeRO-1, $kills kills of one rank ($in_write during a checkpoint write): byte for byte"
