#!/usr/bin/env bash
# dev/bench/library_baselines.py (the libraries' time per kernel family, beside --profile-step's on a
# GPU): on the CPU at tiny's shape it reports every family with a positive, finite time, the counts it
# states, and refuses an inconsistent shape. Skipped (77) where PyTorch is not installed.
set -euo pipefail
python3 -c "import torch" 2>/dev/null || { echo "skipped: PyTorch is not installed (dev/requirements.txt)"; exit 77; }
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 "$root/dev/bench/library_baselines.py" -e tiny -b 2 -t 32 --device cpu --iters 1 --json "$dir/out.json"
python3 - "$dir/out.json" <<'PY'
import json, math, sys
r = json.load(open(sys.argv[1]))
assert (r["layers"], r["heads"], r["channels"], r["B"], r["T"]) == (2, 4, 64, 2, 32), r
fam = r["families"]
assert sorted(fam) == ["adamw", "attention", "classifier", "layernorm", "matmul"], sorted(fam)
for name, f in fam.items():
    assert math.isfinite(f["ms"]) and f["ms"] > 0, (name, f)
# 2mnk x 3 per GEMM: 4 per layer and the head, B*T = 64 rows.
C, BT, L = 64, 64, 2
assert fam["matmul"]["flops"] == 6.0 * BT * (C * 3 * C + C * C + 2 * C * 4 * C) * L + 6.0 * BT * C * 50304
assert fam["adamw"]["parameters"] == 50304 * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C
assert abs(r["micro_step_ms"] - sum(f["ms"] for k, f in fam.items() if k != "adamw")) < 1e-9
PY
"$root/test/expect_failure.sh" "--channels 66 is not a multiple of --heads 4" \
    python3 "$root/dev/bench/library_baselines.py" -e tiny --channels 66 --device cpu --iters 1
echo "library baselines: every family timed on the CPU, the stated counts, the shape check"
