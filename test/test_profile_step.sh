#!/usr/bin/env bash
# train_gpt --profile-step on a tiny GPT-2: one warm-up step, one recorded and timed step, the
# per-kernel table (with the model's kernel names and measured times), the host's upload time, then exit.
# Usage: test_profile_step.sh TRAIN_BINARY
set -euo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir" <<'PY'
import struct, sys
tokens = ([50256] + [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13] * 20) * 20
with open(f"{sys.argv[1]}/train_000000.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
"$bin" -e tiny -b 2 -t 32 -i "$dir/train_*.bin" -v 0 -s 0 --profile-step > "$dir/log"
cat "$dir/log"
python3 - "$dir/log" <<'PY'
import re, sys
log = open(sys.argv[1]).read()
rows = {}
for line in log.splitlines():
    # names may hold spaces (template arguments: "attention_forward_kernel<32, float>", cut with "..." when long)
    m = re.match(r"(\S.*?)\s+(simt|tensor|cublasLt|nccl|memset|copy|pcie)\s+(\d+)\s", line)
    if m:
        rows[m.group(1)] = line
# The default attention kernels: tensor cores in the BF16 build, SIMT in the FP32 one.
# The projections add the residual in their epilogue (or, where cuBLASLt refuses that, a plain GEMM and an add).
expected = [r"encoder_forward_kernel", r"layernorm_forward_kernel<\d+, \d+>",
            r"matmul_forward\(C=64, OC=64, bias(, residual)?\)", r"matmul_forward\(C=256, OC=64, bias(, residual)?\)",
            r"attention(_tc)?_forward_kernel<\d+.*", r"attention(_tc)?_backward_dkdv_kernel<\d+.*",
            r"attention(_tc)?_backward_dq_kernel<\d+.*", r"fused_classifier_kernel", r"layernorm_backward_kernel<[14], false>",
            r"layernorm_backward_kernel<2, true>",  # ln2: with the projections' bias gradients
            r"encoder_backward_wte_kernel", r"adamw_kernel", r"global_norm_partials_kernel",
            r"matmul_forward\(C=64, OC=256, bias, gelu\)", r"matmul_backward_dweight\(C=64, OC=50304\)"]
found = {pattern: [name for name in rows if re.fullmatch(pattern, name)] for pattern in expected}
missing = [pattern for pattern, names in found.items() if not names]
assert not missing, f"kernels missing from the table: {missing}"
# Every row has the measured columns (GPU or emulator time, TFLOP/s, GB/s, est/meas) after the estimate.
assert re.search(r"(GPU|emu) ms", log), "no measured column"
for pattern, names in found.items():
    assert len(rows[names[0]].split()) >= 12, f"no measured time for {names[0]}: {rows[names[0]]}"
assert re.search(r"^measured \(wall clock[^)]*\): [0-9.]+ s/step", log, re.M), "no measured step line"
assert re.search(r"^H100 SXM roofline estimate of the same launches: [0-9.]+ s/step", log, re.M), "no estimate line"
m = re.search(r"^host: ([0-9.]+) ms of the step in 1 batch upload \(checks, page-locked copies, encoder grouping\), "
              r"before the micro-step's launches$", log, re.M)
assert m and 0 < float(m.group(1)) < 1e4, "no host upload line (or not a positive time)"
assert "step 1/" not in log, "--profile-step must exit instead of training"
print(f"profile-step: {len(rows)} kernels in the table")
PY
