#!/usr/bin/env bash
# --cp through the real program: 2 context ranks train the same model as one rank, 2 data x 2 context
# ranks (4 processes) as 2 data ranks, and 2 context x 2 tensor ranks and 2 stages x 2 context ranks as
# one rank, step for step (train and validation losses agree to BF16 rounding; test_mpi_train's [cp]
# case checks the numbers to FP32 rounding); checkpoints resume byte for byte on the same grid and
# continue the run on one rank, and from 2 data x 2 context ranks on 2 stages x 2 context and back; the
# dry run plans the ring's buffers and 1/cp of the activations; and every run the program cannot do is
# refused with one line naming the flags.
# Usage: test_context_parallel.sh TRAIN_BINARY "MPIRUN..."
set -euo pipefail
bin=$1
mpirun=${2:-mpirun --allow-run-as-root --oversubscribe}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
source "$(dirname "$0")/model_parallel_lib.sh"
require_ranks 4

python3 "$(dirname "$0")/make_shards.py" "$dir" 13 20000
common=(-e tiny -b 2 -t 32 -x 6 -l 1e-3 -v 3 -m 2 -i "$dir/train_*.bin" -j "$dir/val_*.bin")
run one "$bin" "${common[@]}" -s 3 -g 12
run cp2 $mpirun -np 2 "$bin" "${common[@]}" -s 3 -g 12 --cp 2
run dp2 $mpirun -np 2 "$bin" "${common[@]}" -s 0
run dp2_cp2 $mpirun -np 4 "$bin" "${common[@]}" --cp 2
run tp2_cp2 $mpirun -np 4 "$bin" "${common[@]}" --cp 2 --tp 2
run pp2_cp2 $mpirun -np 4 "$bin" "${common[@]}" --cp 2 --pp 2
grep -q "context parallel: --cp 2, each rank holds 16 of every sequence's 32 tokens" "$dir/cp2.log" \
  || { cat "$dir/cp2.log"; echo "FAIL: --cp 2 does not announce its split"; exit 1; }
# The same tokens per step, the same losses within 2e-4 (BF16: the ring's partial outputs are merged in
# FP32 but the other ranks' keys are rounded activations like the rank's own; measured <= 3e-5).
series_follow one cp2 2e-4 "2 context ranks"
# Samples: drawn by the context group (each window padded to -t), as many as one rank's, 12 tokens each.
# The tokens may differ where BF16 rounding moves a draw (test_mpi_train's [cp] case checks the logits).
python3 - "$dir/one.log" "$dir/cp2.log" <<'PY'
import sys
one, cp2 = ([l for l in open(p) if l.startswith("sample: ")] for p in sys.argv[1:])
assert len(cp2) == len(one) == 2, f"FAIL: {len(cp2)} samples with --cp 2, {len(one)} on one rank (want 2: steps 3 and 6)"
assert all(len(l.split()) == 13 for l in cp2), f"FAIL: --cp 2 samples are not 12 tokens: {cp2}"
same = sum(a == b for a, b in zip(one, cp2))
print(f"--cp 2 printed {len(cp2)} samples of 12 tokens ({same} identical to one rank's)")
PY
series_follow dp2 dp2_cp2 2e-4 "2 data x 2 context ranks"
series_follow one tp2_cp2 2e-4 "2 context x 2 tensor ranks (sequence parallel)"
series_follow one pp2_cp2 2e-4 "2 stages x 2 context ranks"
# The ring's steps on the tensor-core kernels (--attention tc; the emulator's default is simt): as one
# rank with the same kernels.
run one_tc "$bin" "${common[@]}" --attention tc
run cp2_tc $mpirun -np 2 "$bin" "${common[@]}" --cp 2 --attention tc
series_follow one_tc cp2_tc 2e-4 "2 context ranks, tensor-core attention"

# HellaSwag: each context group scores its share of the examples, every row padded to -t and its token
# losses gathered back (test_mpi_train's [cp] case checks those losses); the same examples are scored,
# once each, on 1 and on 2 data x 2 context ranks.
hs=(-s 0 -x 3 -h "$(dirname "$0")/fixtures/hellaswag_tiny.bin")
run one_hs "$bin" "${common[@]}" "${hs[@]}" -o "$dir/one_hs"
run cp2_hs $mpirun -np 4 "$bin" "${common[@]}" "${hs[@]}" --cp 2 -o "$dir/cp2_hs"
python3 - "$dir/one_hs/metrics.jsonl" "$dir/cp2_hs/metrics.jsonl" <<'PY'
import json, sys
one, cp2 = ([r for r in map(json.loads, open(p)) if "hellaswag_examples" in r] for p in sys.argv[1:])
assert len(one) == len(cp2) == 1 and one[0]["step"] == cp2[0]["step"] == 3, f"FAIL: HellaSwag records {one} vs {cp2}"
assert one[0]["hellaswag_examples"] == cp2[0]["hellaswag_examples"] == 3, f"FAIL: examples scored {one} vs {cp2}"
print(f"HellaSwag: 3 examples scored on 2 data x 2 context ranks ({cp2[0]['hellaswag_correct']} correct; {one[0]['hellaswag_correct']} on one rank)")
PY

# Checkpoints under --cp: (1) 3 steps, stop, resume to 6 on the same 2 x 2 grid at ZeRO-1 equals 6
# steps straight, byte for byte; (2) the step-3 checkpoint resumed on one data rank without --cp
# continues the same run (the same batches: 2 data ranks read what one reads in 2 micro-steps), and so
# does it on 2 stages x 2 context ranks; (3) a checkpoint written by 2 stages x 2 context ranks (ZeRO-1
# shards of each stage over its context group) continues on 2 data x 2 context ranks.
ck=(-e tiny -b 2 -t 32 -d 128 -k constant -l 1e-3 -c 0.1 -v 0 -s 0 -i "$dir/train_*.bin" -j "$dir/val_*.bin" -n 3 -z 1)
run straight $mpirun -np 4 "$bin" "${ck[@]}" --cp 2 -x 6 -o "$dir/straight"
run first $mpirun -np 4 "$bin" "${ck[@]}" --cp 2 -x 3 -o "$dir/resumed"
mkdir -p "$dir/np1" "$dir/to_pp"
cp "$dir/resumed/"*00000003* "$dir/np1/"
cp "$dir/resumed/"*00000003* "$dir/to_pp/"
run second $mpirun -np 4 "$bin" "${ck[@]}" --cp 2 -x 6 -o "$dir/resumed" -y
same_checkpoint "--cp 2" "$dir/straight" "$dir/resumed" 6
echo "--cp 2, 2 data ranks, ZeRO-1: 3 + 3 steps equal 6 steps byte for byte (model and state)"
run np1 "$bin" "${ck[@]}" -x 6 -o "$dir/np1" -y
run to_pp $mpirun -np 4 "$bin" "${ck[@]}" --cp 2 --pp 2 -x 6 -o "$dir/to_pp" -y
run pp_first $mpirun -np 4 "$bin" "${ck[@]}" --cp 2 --pp 2 -x 3 -o "$dir/from_pp"
run from_pp $mpirun -np 4 "$bin" "${ck[@]}" --cp 2 -x 6 -o "$dir/from_pp" -y
continued_like straight "np1:2 data x 2 context -> 1 rank" "to_pp:2 data x 2 context -> 2 stages x 2 context" \
  "from_pp:2 stages x 2 context (steps 1-3) -> 2 data x 2 context"

# The plan: each rank's activations are those of T / cp tokens, plus the ring's buffers; the emulator's
# peak is the plan (test_mpi_train's [cp] case).
plan=(-e tiny -b 4 -t 64 -v 0 -s 0 -i "$dir/train_*.bin" --dry-run --json)
"$bin" "${plan[@]}" > "$dir/plan1.json"
"$bin" "${plan[@]}" --cp 4 --world-size 4 > "$dir/plan4.json"
python3 - "$dir/plan1.json" "$dir/plan4.json" <<'PY'
import json, sys
one, four = (json.load(open(p)) for p in sys.argv[1:])
def buffers(plan):
    return plan["bytes"]["items"]
assert four["context_parallel"] == 4 and one["context_parallel"] == 1
a1, a4 = one["bytes"]["activations"], four["bytes"]["activations"]
assert a4 * 4 == a1, f"FAIL: activations {a4} bytes per rank at --cp 4, {a1} at 1: not a quarter"
ring = {k: v for k, v in buffers(four).items() if k.startswith("context_")}
# tiny: C 64, 4 heads; B 4 x 16 local rows: k|v 2 x 64 x 128 BF16, dk|dv 2 x 64 x 128 FP32, sums 64 x 64 FP32
want = {"context_kv": 2 * 64 * 128 * 2, "context_dkv": 2 * 64 * 128 * 4, "context_sum": 64 * 64 * 4,
        "context_part_out": 64 * 64 * 4, "context_part_lse": 64 * 4 * 4}
assert ring == want, f"FAIL: the ring's buffers {ring}, expected {want}"
assert not any(k.startswith("context_") for k in buffers(one)), "FAIL: ring buffers without --cp"
print(f"--dry-run --cp 4: activations {a4} bytes per rank (1/4 of {a1}), ring buffers {sum(ring.values())} bytes")
PY

# Refusals: one line, the flags named, non-zero exit.
refuse "--cp 2 splits each sequence into 2 x cp = 4 chunks (zigzag), which must divide -t 30" \
  "$bin" "${common[@]}" -t 30 --cp 2 --world-size 2 --dry-run
refuse "--cp 2 does not divide the 3 ranks" $mpirun -np 3 "$bin" "${common[@]}" --cp 2
refuse "--pp 2 x --cp 2 does not divide the 6 ranks" "$bin" "${common[@]}" --cp 2 --pp 2 --world-size 6 --dry-run
refuse "cannot go with --cp 2" "$bin" -e tiny --generate --cp 2
echo PASS
