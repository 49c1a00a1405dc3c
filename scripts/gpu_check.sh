#!/usr/bin/env bash
# The checks that need a GPU, in one go: build train_gpt (nvcc), run the test suite on the GPU
# (make test-gpu), train GPT-2 124M (d12) for 20 steps, and 20 more with --matmul-autotune, then
# profile one step (--profile-step: every kernel's measured time, TFLOP/s and GB/s beside its H100
# roofline estimate). Prints each run's median tokens/s and MFU at the end.
#   scripts/gpu_check.sh
# Environment:
#   B            micro-batch (default 16; d12 at B=64, T=1024 needs about 30 GB)
#   T            sequence length (default 1024)
#   TRAIN_DATA   token-shard glob (default data/shakespeare/train_*.bin, prepared by `make train`'s
#                data step, data/prepare.py; when missing and it cannot be prepared offline, a
#                synthetic shard is written to a temporary folder: the timing does not depend on
#                the tokens)
#   SKIP_TESTS=1 skip make test-gpu
# Writes its logs to ${OUT:-out/gpu_check}/.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-16}
T=${T:-1024}
out=${OUT:-out/gpu_check}
mkdir -p "$out"
nvidia-smi -L >/dev/null 2>&1 || { echo "gpu_check.sh: no GPU (nvidia-smi -L failed)" >&2; exit 1; }

echo "== build: make train_gpt"
make train_gpt

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== tests: make test-gpu"
  make test-gpu 2>&1 | tee "$out/test_gpu.log"
fi

echo "== data"
train=${TRAIN_DATA:-data/shakespeare/train_*.bin}
if ! compgen -G "$train" >/dev/null; then
  if [ -z "${TRAIN_DATA:-}" ] && python3 data/prepare.py --out data/shakespeare >"$out/prepare.log" 2>&1; then
    echo "prepared data/shakespeare (data/prepare.py)"
  else
    synthetic=$(mktemp -d)
    trap 'rm -rf "$synthetic"' EXIT
    python3 - "$synthetic" <<'PY'
import random, struct, sys
random.seed(1337)
tokens = []
while len(tokens) < 4_000_000:
    tokens.append(50256)
    tokens.extend(random.randrange(50256) for _ in range(random.randrange(200, 2000)))
with open(f"{sys.argv[1]}/train_000000.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
    train="$synthetic/train_*.bin"
    echo "no prepared data: using a synthetic shard of random tokens ($train)"
  fi
fi

echo "== 20 training steps: d12, B=$B, T=$T"
./train_gpt -e d12 -b "$B" -t "$T" -x 20 -l 6e-4 -u 5 -v 0 -s 0 -i "$train" 2>&1 | tee "$out/train.log"

echo "== 20 training steps with --matmul-autotune (each GEMM shape's fastest cuBLASLt candidate)"
./train_gpt -e d12 -b "$B" -t "$T" -x 20 -l 6e-4 -u 5 -v 0 -s 0 -i "$train" --matmul-autotune 2>&1 | tee "$out/train_autotune.log"

echo "== --profile-step: d12, B=$B, T=$T"
./train_gpt -e d12 -b "$B" -t "$T" -v 0 -s 0 -i "$train" --profile-step 2>&1 | tee "$out/profile.log"

# Step lines: "step 12/20 | loss ... | 812.3 ms | 64,512 tok/s | MFU 41.2% | ETA 6m12s". The
# median over steps 3-20 leaves out the first steps' start-up (cuBLASLt heuristics, clocks).
python3 - "$out/train.log" "$out/train_autotune.log" <<'PY'
import re, statistics, sys
for path, label in zip(sys.argv[1:], ["", " with --matmul-autotune"]):
    rates, mfus = [], []
    for line in open(path):
        m = re.match(r"step (\d+)/\d+ .*\| ([\d,]+) tok/s \| MFU ([\d.]+|n/a)%?", line)
        if m and int(m.group(1)) >= 3:
            rates.append(float(m.group(2).replace(",", "")))
            if m.group(3) != "n/a":
                mfus.append(float(m.group(3)))
    if not rates:
        sys.exit(f"gpu_check.sh: no step lines in {path}")
    mfu = f"{statistics.median(mfus):.1f}%" if mfus else "n/a (unknown GPU peak)"
    print(f"== result: d12 training{label}, median of steps 3-20: {statistics.median(rates):,.0f} tokens/s, MFU {mfu}")
PY
grep -E "^(measured|H100 SXM roofline estimate)" "$out/profile.log" || true
