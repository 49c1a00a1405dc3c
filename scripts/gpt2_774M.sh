#!/usr/bin/env bash
# GPT-2 774M (d36). Not a published recipe: between the 124M and 1.5B settings (batch 1048576 tokens,
# lr 2.5e-4, 700 warmup steps), ZeRO-1.
exec "$(dirname "$0")/run_gpt2.sh" "${OUT:-out/gpt2_774M}" -e d36 -b 16 -t 1024 -d 1048576 -x 30000 \
  -l 2.5e-4 -u 700 -q 0.0 -k cosine -c 0.1 -z 1 -v 250 -m 20 -s 5000 -g 144 -n 2000 --keep-last 3 "$@"
