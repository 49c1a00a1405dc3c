#!/usr/bin/env bash
# --tp through the real program: 2 data x 2 tensor ranks (4 processes) train the same model as 2 data
# ranks alone, step for step (the losses agree to BF16 rounding; test_mpi_train's [tp] case checks the
# numbers to FP32 rounding), with sequence parallelism (the default) and without, print one sample; checkpoints resume byte for byte on the same grid and
# continue the run on another (tp 4, one rank); and every run the program cannot do is refused with
# one line naming the flags, before any training.
# Usage: test_tensor_parallel.sh TRAIN_BINARY "MPIRUN..."
set -euo pipefail
bin=$1
mpirun=${2:-mpirun --allow-run-as-root --oversubscribe}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
source "$(dirname "$0")/model_parallel_lib.sh"
require_ranks 4

python3 "$(dirname "$0")/make_shards.py" "$dir" 13 20000
common=(-e tiny -b 2 -t 32 -x 6 -l 1e-3 -v 3 -m 2 -s 6 -g 8 -i "$dir/train_*.bin" -j "$dir/val_*.bin")
$mpirun -np 2 "$bin" "${common[@]}" > "$dir/dp.log" 2>&1 || { cat "$dir/dp.log"; echo "FAIL: 2 data ranks exited non-zero"; exit 1; }
$mpirun -np 4 "$bin" "${common[@]}" --tp 2 > "$dir/tp.log" 2>&1 || { cat "$dir/tp.log"; echo "FAIL: --tp 2 on 4 ranks exited non-zero"; exit 1; }
$mpirun -np 4 "$bin" "${common[@]}" --tp 2 --sequence-parallel off > "$dir/tp_nosp.log" 2>&1 \
  || { cat "$dir/tp_nosp.log"; echo "FAIL: --tp 2 --sequence-parallel off exited non-zero"; exit 1; }
grep -q "x 4 (2 data x 2 tensor)" "$dir/tp.log" || { cat "$dir/tp.log"; echo "FAIL: the run does not announce its grid"; exit 1; }

# The same tokens per step, the same losses within 2e-4 (BF16: partial projections rounded before
# their sum).
losses_follow dp tp 2e-4 "2 data x 2 tensor ranks with sequence parallelism"
losses_follow dp tp_nosp 2e-4 "2 data x 2 tensor ranks without sequence parallelism"
grep -q "^cuda graph" "$dir/tp.log" || { echo "FAIL: --tp 2 captured no CUDA graph"; exit 1; }

# Checkpoints under --tp: the model file holds the whole model (gathered from the slices), the state
# file the whole model's layout. (1) 3 steps, stop, resume to 6 on the same 2 x 2 grid at ZeRO-1 equals
# 6 steps straight, byte for byte; (2) the step-3 checkpoint resumed on 1 data x 4 tensor ranks and on
# one rank continues the same run (losses within BF16 rounding of the straight run's).
ck=(-e tiny -b 2 -t 32 -d 128 -k constant -l 1e-3 -c 0.1 -v 0 -s 0 -i "$dir/train_*.bin" -j "$dir/val_*.bin" -n 3 -z 1)
run straight $mpirun -np 4 "$bin" "${ck[@]}" --tp 2 -x 6 -o "$dir/straight"
run first $mpirun -np 4 "$bin" "${ck[@]}" --tp 2 -x 3 -o "$dir/resumed"
for grid in "4 4" "1 1"; do  # the step-3 checkpoint, copied before the resumes below add to it
  set -- $grid
  mkdir -p "$dir/np$1"
  cp "$dir/resumed/"*00000003* "$dir/np$1/"
done
run second $mpirun -np 4 "$bin" "${ck[@]}" --tp 2 -x 6 -o "$dir/resumed" -y
same_checkpoint "--tp 2" "$dir/straight" "$dir/resumed" 6
echo "--tp 2, 2 data ranks, ZeRO-1: 3 + 3 steps equal 6 steps byte for byte (model and state)"
run np4 $mpirun -np 4 "$bin" "${ck[@]}" --tp 4 -x 6 -o "$dir/np4" -y
run np1 "$bin" "${ck[@]}" -x 6 -o "$dir/np1" -y
continued_like straight "np4:2 data x 2 tensor -> 1 data x 4 tensor" "np1:2 data x 2 tensor -> 1 rank"

# The dry run's count of the tensor group's collectives (what its traffic estimate multiplies) is what
# a profiled step issues: its ncclAllGather and ncclReduceScatter rows, with and without sequence
# parallelism (then the all-reduces also carry the gradients' data-parallel reduction: not compared).
for recompute in none selective full; do
  prof=(-e tiny -b 2 -t 32 -x 2 -v 0 -s 0 -i "$dir/train_*.bin" -j "$dir/val_*.bin" --tp 2 -r $recompute --sequence-parallel on)
  "$bin" "${prof[@]}" --world-size 2 --dry-run --json > "$dir/plan.json"
  $mpirun -np 2 "$bin" "${prof[@]}" --profile-step > "$dir/profile.log" 2>&1 || { cat "$dir/profile.log"; echo "FAIL: --profile-step"; exit 1; }
  python3 - "$dir/plan.json" "$dir/profile.log" "$recompute" <<'PY'
import json, re, sys
plan = json.load(open(sys.argv[1]))["tensor_parallel_traffic"]
text = open(sys.argv[2]).read()
def issued(name):
    m = re.search(rf"^{name}\s+nccl\s+(\d+)", text, re.M)
    return int(m.group(1)) if m else 0
for name, key in (("ncclAllGather", "all_gathers_per_micro_step"), ("ncclReduceScatter", "reduce_scatters_per_micro_step")):
    if issued(name) != plan[key] or plan[key] == 0:
        sys.exit(f"FAIL: -r {sys.argv[3]}: the step issued {issued(name)} {name}, the dry run counts {plan[key]}")
print(f"-r {sys.argv[3]}: the dry run's {plan['all_gathers_per_micro_step']} all-gathers and "
      f"{plan['reduce_scatters_per_micro_step']} reduce-scatters are the profiled step's")
PY
done

# Refusals: one line, the flags named, non-zero exit.
refuse "does not divide the model's 4 heads" "$bin" "${common[@]}" --tp 3 --world-size 3 --dry-run
refuse "--tp 2 does not divide the 3 ranks" $mpirun -np 3 "$bin" "${common[@]}" --tp 2
refuse "cannot go with --tp 2" "$bin" -e tiny --generate --tp 2
refuse "must be a multiple of --tp 4" "$bin" "${common[@]}" -t 30 --tp 4 --world-size 4 --dry-run
refuse "--sequence-parallel on splits the tokens over the tensor ranks: it needs --tp > 1" "$bin" "${common[@]}" --sequence-parallel on
echo PASS
