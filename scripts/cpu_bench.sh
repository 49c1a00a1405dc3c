#!/usr/bin/env bash
# The CPU build as a trainer, measured (make cpu-bench): GPT-2 124M (d12), random init, B=4, T=64
# on data/shakespeare, for the BF16 and the FP32 build, in one run on this machine:
#   - s/step: the median of steps 2-11 of a training run (step 1 warms up);
#   - the GEMM limit: the step's matmuls alone, same shapes and library (dev/gemm_limit.cu);
#   - the non-GEMM share: 1 - cuBLASLt time / step time, from --profile-step.
#   scripts/cpu_bench.sh BF16_BUILD_DIR FP32_BUILD_DIR     (make cpu-bench builds both first)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: scripts/cpu_bench.sh BF16_BUILD_DIR FP32_BUILD_DIR" >&2; exit 2; }
flags=(-e d12 -b 4 -t 64 -v 0 -s 0 -n 0 -i 'data/shakespeare/train_*.bin')
out=out/cpu_bench
mkdir -p "$out"

echo "cpu-bench: GPT-2 124M (d12), B=4, T=64; $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "           OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} in the environment (the emulator uses SkylakeX kernels where the CPU has AVX-512)"
printf '%-6s %10s %22s %12s %18s\n' build "s/step" "GEMM limit s (GFLOP/s)" "step/limit" "non-GEMM share"
for pair in "BF16 $1" "FP32 $2"; do
  read -r name dir <<< "$pair"
  log="$out/${name}_steps.log"
  "$dir/train_gpt_cpu" "${flags[@]}" -x 11 -o "$out/$name" > "$log" 2>&1 || { cat "$log"; exit 1; }
  step=$(grep -E '^step ([2-9]|1[01])/' "$log" | sed -E 's/.*\| ([0-9.]+) ms \|.*/\1/' | sort -n |
         awk '{v[NR]=$1} END {if (NR == 0) exit 1; m = (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2; printf "%.3f", m / 1000}')
  profile="$out/${name}_profile.log"
  "$dir/train_gpt_cpu" "${flags[@]}" -o "$out/$name" --profile-step > "$profile" 2>&1 || { cat "$profile"; exit 1; }
  # Rows end: unit launches GFLOP GB FLOP/B est-ms bound emu-ms TFLOP/s GB/s est/meas (names may hold spaces).
  gemm_ms=$(awk 'NF > 10 && $(NF-10) == "cublasLt" {sum += $(NF-3)} END {printf "%.1f", sum}' "$profile")
  profiled=$(sed -nE 's/^measured \(wall clock\): ([0-9.]+) s\/step.*/\1/p' "$profile")
  limit_line=$("$dir/gemm_limit" -e d12 -b 4 -t 64 2>/dev/null)
  limit=$(sed -E 's/.*, ([0-9.]+) s at ([0-9.]+) GFLOP\/s.*/\1/' <<< "$limit_line")
  rate=$(sed -E 's/.*, ([0-9.]+) s at ([0-9.]+) GFLOP\/s.*/\2/' <<< "$limit_line")
  awk -v n="$name" -v s="$step" -v l="$limit" -v r="$rate" -v g="$gemm_ms" -v p="$profiled" 'BEGIN {
    printf "%-6s %10.3f %13.3f (%6.1f) %11.1fx %17.0f%%\n", n, s, l, r, s / l, 100 * (1 - g / 1000 / p) }'
done
echo "targets (issue 13): BF16 <= 1.0 s/step, FP32 <= 0.9 s/step, non-GEMM share <= 40%; logs in $out/"
