#!/usr/bin/env bash
# GPT-2 124M on 10B FineWeb tokens, the hyperparameters of public llm.c reproductions: total batch
# 524288 tokens (B=64 x T=1024 x 8 GPUs), lr 6e-4 with 700 warmup steps, cosine to 0, weight decay
# 0.1, ZeRO-1; 18865 steps = 10B tokens. Resumable: rerun the same command.
exec "$(dirname "$0")/run_gpt2.sh" "${OUT:-out/gpt2_124M}" -e d12 -b 64 -t 1024 -d 524288 -x 18865 \
  -l 6e-4 -u 700 -q 0.0 -k cosine -c 0.1 -z 1 -v 250 -m 20 -s 5000 -g 144 -n 5000 --keep-last 3 "$@"
