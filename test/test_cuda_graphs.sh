#!/usr/bin/env bash
# --cuda-graphs through the real program on 2 ranks: with ZeRO-1 (the gradients reduced after the last
# of 4 micro-steps: two graphs) and ZeRO-2 (reduced after every micro-step: one graph), and with 2
# context ranks (--cp 2: the ring's transfers on a stream of their own, forked from and joined into
# the captured one; ZeRO-2 on the SIMT kernels, and ZeRO-1 on the tensor-core kernels with documents
# crossing the chunks), 3 steps replayed from CUDA graphs write the same model file, byte for byte, as 3
# steps launched kernel by kernel, and rank 0 says once per graph that it captured it.
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

# name, ZeRO stage, graphs captured (two with a separate reduction step), flags
configs=("z1 1 2" "z2 2 1" "cp2_z2 2 1 --cp 2" "cp2_tc_docs_z1 1 2 --cp 2 --attention tc --doc-mask")
for config in "${configs[@]}"; do
  read -r name zero want flags <<< "$config"
  for graphs in on off; do
    # shellcheck disable=SC2086  # flags: several words
    $mpirun -np 2 "$bin" "${common[@]}" -z $zero $flags --cuda-graphs $graphs -o "$dir/${name}_$graphs" \
      > "$dir/${name}_$graphs.log" 2>&1 \
      || { cat "$dir/${name}_$graphs.log"; echo "FAIL: $name, --cuda-graphs $graphs exited non-zero"; exit 1; }
  done
  captures=$(grep -c '^cuda graph: .* captured once' "$dir/${name}_on.log" || true)
  [ "$captures" = "$want" ] || { cat "$dir/${name}_on.log"; echo "FAIL: $name captured $captures graphs, want $want"; exit 1; }
  if grep -q '^cuda graph' "$dir/${name}_off.log"; then echo "FAIL: $name: --cuda-graphs off captured a graph"; exit 1; fi
  cmp "$dir/${name}_on/model_00000003.bin" "$dir/${name}_off/model_00000003.bin" \
    || { echo "FAIL: $name: the model replayed from graphs differs from the eager one"; exit 1; }
  echo "$name (ZeRO-$zero${flags:+ $flags}): $captures graph(s) captured; 3 steps on 2 ranks equal to eager, byte for byte"
done
echo PASS
