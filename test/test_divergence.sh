#!/usr/bin/env bash
# Divergence, through the real program (host/divergence.h): (1) a learning rate of 1e9 blows a tiny
# model up; the run stops with a non-zero exit after --max-skipped-steps skipped steps in a row,
# naming the step, and every checkpoint it wrote holds finite parameters; with
# --max-skipped-steps 0 the same run goes on to its end. (2) A learning rate that overflows BF16
# parameters in one update: the checkpoint of that step is refused, with a non-zero exit. (3) A model
# file with NaN parameters given to -e is an error at start. (4) --on-divergence rollback: a window of
# random tokens in data the model has learned is skipped as loss outliers, 3 in a row; the run rolls
# back to the newest checkpoint before the skips, skips the window's data, and finishes; with no
# rollback left it stops.
# Usage: test_divergence.sh TRAIN_BINARY
set -euo pipefail
bin=$1
here=$(dirname "$0")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

python3 "$here/make_shards.py" "$dir" 3 20000
common=(-e tiny -b 2 -t 32 -k constant -v 0 -s 0 -i "$dir/train_*.bin" -j "$dir/val_*.bin")

# A model file's parameters (llm.c's format: 256 int32 header, version 3 FP32 or 5 BF16): finite?
finite_model() {
    python3 - "$1" <<'PY'
import array, struct, sys
data = open(sys.argv[1], "rb").read()
header = struct.unpack_from("<256i", data)
assert header[0] == 20240326, f"{sys.argv[1]}: not a model file"
code, mask = ("I", 0x7F800000) if header[1] == 3 else ("H", 0x7F80)
values = array.array(code, data[1024:])
bad = sum(1 for v in values if v & mask == mask)
assert bad == 0, f"{sys.argv[1]}: {bad} of {len(values)} parameters are not finite"
print(f"{sys.argv[1].split('/')[-1]}: {len(values)} finite parameters")
PY
}

# (1) Blow-up: step 1's update is huge; from step 2 on the loss and the gradient norm are NaN and steps
# are skipped, with either attention kernels. (At 1e6 the SIMT kernels' gradients stay finite, about
# 1e7 in norm with a loss of about 3e13, while the tensor-core ones' turn NaN: 1e9 overflows both.)
"$here/expect_failure.sh" "step 6: 5 steps in a row skipped .*diverged" \
    "$bin" "${common[@]}" -x 12 -l 1e9 -n 2 -o "$dir/blowup"
for model in "$dir"/blowup/model_*.bin; do finite_model "$model"; done
test ! -e "$dir/blowup/model_00000006.bin" || { echo "a checkpoint of the diverged step 6 was written"; exit 1; }
"$bin" "${common[@]}" -x 8 -l 1e9 --max-skipped-steps 0 -o "$dir/never" > "$dir/never.log" 2> "$dir/never.err"
grep -cE "step [2-8] skipped: (loss|gradient norm) is -?nan" "$dir/never.err" | grep -qx 7 ||
    { echo "--max-skipped-steps 0: expected steps 2-8 skipped"; cat "$dir/never.err"; exit 1; }
echo "divergence: a blown-up run stops at step 6 (5 skips in a row), goes on with --max-skipped-steps 0"
# Rollback needs a checkpoint from before the step ahead of the first skip (step 1's update blew it up).
"$here/expect_failure.sh" "step 6: 5 steps in a row skipped .*; no complete checkpoint at step 0 or before to roll back to" \
    "$bin" "${common[@]}" -x 12 -l 1e9 -n 2 --on-divergence rollback -o "$dir/blowup_rollback"

# (2) An update that overflows the BF16 parameters (|w| past 3.39e38 rounds to inf): no checkpoint.
if head -1 "$dir/never.log" | grep -q BF16; then
    "$here/expect_failure.sh" "step 1: parameters are not finite .*no checkpoint written" \
        "$bin" "${common[@]}" -x 3 -l 3.4e38 -n 1 -o "$dir/overflow"
    test ! -e "$dir/overflow/model_00000001.bin" || { echo "a checkpoint of non-finite parameters was written"; exit 1; }
else
    echo "divergence: FP32 build: (2) needs BF16 parameters, which a 3.4e38 update overflows; not run"
fi

# (3) A model file whose parameters are NaN.
python3 - "$dir/blowup/model_00000002.bin" "$dir/nan_model.bin" <<'PY'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
data[1024:] = b"\xff" * (len(data) - 1024)  # all ones: NaN in BF16 and in FP32
data[32:36] = b"\0\0\0\0"  # header int 8: no checksum, as llm.c writes (else the CRC-32C check fires first)
open(sys.argv[2], "wb").write(data)
PY
"$here/expect_failure.sh" "model '.*nan_model.bin': parameters are not finite" \
    "$bin" -e "$dir/nan_model.bin" -b 2 -t 32 -x 2 -v 0 -s 0 -i "$dir/train_*.bin" -j "$dir/val_*.bin"
echo "divergence: a model file with NaN parameters is refused at start"

# (4) Rollback. Shards (taken in the order A, P, B with --seed 4, host/dataloader.h's seeded shard
# order): A, 60 steps of a period-4 token pattern the model learns (loss ~3e-4 by step 58 at lr 1e-2);
# P, 3 steps of random tokens (loss ~18.8: z-scores 5.2, 4.3 and 3.7 over the trailing window, all
# above --skip-loss-z 3); B, 20 more steps of the pattern.
mkdir -p "$dir/rollback"
python3 - "$dir/rollback" <<'PY'
import random, struct, sys
def shard(name, tokens):
    with open(f"{sys.argv[1]}/{name}", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
pattern = lambda n: [(10, 20, 30, 40)[i % 4] for i in range(n)]
random.seed(3)
shard("train_000000.bin", pattern(60 * 64 + 1))
shard("train_000001.bin", [random.randrange(50257) for _ in range(3 * 64 + 1)])
shard("train_000002.bin", pattern(20 * 64 + 1))
PY
rollback=(-e tiny -b 2 -t 32 -k constant -l 1e-2 -u 0 -v 0 -s 0 --seed 4 -i "$dir/rollback/train_*.bin" -n 10
          --skip-loss-z 3 --max-skipped-steps 3 --on-divergence rollback)
"$bin" "${rollback[@]}" -x 70 -o "$dir/rollback/out" > "$dir/rollback.log" 2> "$dir/rollback.err"
grep -q "step 63: diverged (skips from step 61 on); rolled back to step 50, skipping the data of steps 51-63 (rollback 1 of 3)" \
    "$dir/rollback.err" || { echo "rollback: expected a rollback from step 63 to step 50"; cat "$dir/rollback.err"; exit 1; }
test "$(grep -c 'skipped: loss .* is an outlier' "$dir/rollback.err")" -eq 3 ||
    { echo "rollback: expected exactly the 3 window steps skipped"; cat "$dir/rollback.err"; exit 1; }
python3 - "$dir/rollback/out/metrics.jsonl" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
last = rows[-1]
assert last["step"] == 70, f"rollback: the run ended at step {last['step']}, not 70"
assert last["loss"] < 0.01, f"rollback: final loss {last['loss']} (the pattern should stay learned)"
print(f"rollback: finished at step 70, loss {last['loss']:.2e}; steps 51-70 read the data after the window")
PY
"$here/expect_failure.sh" "step 63: 3 steps in a row skipped .*; no rollback left \\(--max-rollbacks 0\\)" \
    "$bin" "${rollback[@]}" -x 70 --max-rollbacks 0 -o "$dir/rollback/none"
echo "divergence: --on-divergence rollback skipped the diverged window and finished; with no rollback left it stopped"
