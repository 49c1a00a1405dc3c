#!/usr/bin/env bash
# scripts/plot_metrics.py on a metrics.jsonl as train_gpt writes it, with the oddities a real one has
# (a resumed step written twice, a null loss, a line cut by a crash): one PNG of four panels (loss and
# val loss, lr, grad norm, tokens/s; 1080 x 1200 pixels at 120 dpi), the cut line skipped with a warning.
# matplotlib comes with scripts/install_python_deps.sh (make test's deps step); without it: skipped (77).
# Usage: test_plot_metrics.sh
set -euo pipefail
here=$(dirname "$0")
python3 -c "import matplotlib" 2>/dev/null || { echo "plot_metrics: SKIPPED: matplotlib is not installed"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir/metrics.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for step in range(1, 41):
        loss = None if step == 7 else 10.0 - 0.1 * step
        f.write(json.dumps({"step": step, "loss": loss, "lr": 1e-3, "grad_norm": 1.0 + 0.01 * step, "ms": 700.0,
                            "tokens_per_second": 700.0 + step, "mfu": None, "batch_tokens": 512}) + "\n")
        if step % 10 == 0:  # the last validation over more tokens (--final-val-batches), one without a count
            tokens = 8192 if step == 40 else None if step == 10 else 1024
            f.write(json.dumps({"step": step, "val_loss": 9.0 - 0.1 * step, "val_tokens": tokens}) + "\n")
    f.write(json.dumps({"step": 40, "loss": 5.9, "lr": 1e-3, "grad_norm": 1.4, "ms": 700.0,
                        "tokens_per_second": 741.0, "mfu": None, "batch_tokens": 512}) + "\n")  # resumed: written twice
    f.write('{"step": 41, "loss": 5.')  # cut by a crash
PY
python3 "$here/../scripts/plot_metrics.py" "$dir" --no-install > "$dir/out" 2> "$dir/err"
grep -q "skipped unreadable line" "$dir/err" || { echo "plot_metrics: no warning for the cut line"; cat "$dir/err"; exit 1; }
python3 - "$dir/metrics.png" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
width, height = struct.unpack(">II", data[16:24])
assert (width, height) == (1080, 1200), f"expected the 4-panel figure, 1080 x 1200, got {width} x {height}"
print(f"plot_metrics: {sys.argv[1].split('/')[-1]}, {width} x {height}, {len(data)} bytes")
PY
