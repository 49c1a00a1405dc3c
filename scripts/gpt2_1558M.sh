#!/usr/bin/env bash
# GPT-2 1.5B (d48), as in llm.c's public 1.5B run: total batch 1048576 tokens (B=16 x T=1024 x 8 GPUs
# x 8 micro-steps), 32000 steps, lr 6e-4 with 700 warmup steps, cosine to 0, weight decay 0.1,
# ZeRO-1. Check the plan first: ./train_gpt -e d48 -b 16 -t 1024 --world-size 8 -z 1 --dry-run
exec "$(dirname "$0")/run_gpt2.sh" "${OUT:-out/gpt2_1558M}" -e d48 -b 16 -t 1024 -d 1048576 -x 32000 \
  -l 6e-4 -u 700 -q 0.0 -k cosine -c 0.1 -z 1 -v 250 -m 20 -s 2000 -g 144 -n 1000 --keep-last 3 "$@"
