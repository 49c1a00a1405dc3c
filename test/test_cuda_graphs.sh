#!/usr/bin/env bash
# --cuda-graphs through the real program on 2 ranks: with ZeRO-1 (the gradients reduced after the last
# of 4 micro-steps: two graphs) and ZeRO-2 (reduced after every micro-step: one graph), 3 steps
# replayed from CUDA graphs write the same model file, byte for byte, as 3 steps launched kernel by
# kernel, and rank 0 says once per graph that it captured it.
# Usage: test_cuda_graphs.sh TRAIN_BINARY "MPIRUN..."
set -euo pipefail
bin=$1
mpirun=${2:-mpirun --allow-run-as-root --oversubscribe}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
source "$(dirname "$0")/model_parallel_lib.sh"
require_ranks 2

python3 "$(dirname "$0")/make_shards.py" "$dir" 11 20000
common=(-e tiny -b 2 -t 32 -d 512 -x 3 -l 1e-3 -v 0 -s 0 -i "$dir/train_*.bin" -j "$dir/val_*.bin" -n 3)

for zero in 1 2; do
  for graphs in on off; do
    $mpirun -np 2 "$bin" "${common[@]}" -z $zero --cuda-graphs $graphs -o "$dir/z${zero}_$graphs" > "$dir/z${zero}_$graphs.log" 2>&1 \
      || { cat "$dir/z${zero}_$graphs.log"; echo "FAIL: ZeRO-$zero, --cuda-graphs $graphs exited non-zero"; exit 1; }
  done
  captures=$(grep -c '^cuda graph: .* captured once' "$dir/z${zero}_on.log" || true)
  want=$([ $zero = 1 ] && echo 2 || echo 1)
  [ "$captures" = "$want" ] || { cat "$dir/z${zero}_on.log"; echo "FAIL: ZeRO-$zero captured $captures graphs, want $want"; exit 1; }
  if grep -q '^cuda graph' "$dir/z${zero}_off.log"; then echo "FAIL: --cuda-graphs off captured a graph"; exit 1; fi
  cmp "$dir/z${zero}_on/model_00000003.bin" "$dir/z${zero}_off/model_00000003.bin" \
    || { echo "FAIL: ZeRO-$zero: the model replayed from graphs differs from the eager one"; exit 1; }
  echo "ZeRO-$zero: $captures graph(s) captured; 3 steps on 2 ranks equal to eager, byte for byte"
done
echo PASS
