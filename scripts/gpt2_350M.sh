#!/usr/bin/env bash
# GPT-2 350M (d24). Not a published recipe: the 124M settings with the batch kept at 524288 tokens
# and the peak lr lowered to 3e-4 for the wider model (interpolated between 124M and 1.5B).
exec "$(dirname "$0")/run_gpt2.sh" "${OUT:-out/gpt2_350M}" -e d24 -b 32 -t 1024 -d 524288 -x 38000 \
  -l 3e-4 -u 700 -q 0.0 -k cosine -c 0.1 -z 1 -v 250 -m 20 -s 5000 -g 144 -n 5000 --keep-last 3 "$@"
