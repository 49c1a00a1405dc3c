#!/usr/bin/env bash
# Data checked at start, through the real program: a training shard holding a token outside GPT-2's
# vocabulary (50257) stops the run before its first step, with one line naming the shard, the
# token's index and value, and a non-zero exit (the model would otherwise read past wte).
# Usage: test_data_check.sh TRAIN_BINARY
set -euo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir" <<'PY'
import struct, sys
def shard(path, tokens):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
good = [(7 * i) % 50257 for i in range(3000)]
shard(f"{sys.argv[1]}/train_000000.bin", good)
bad = list(good)
bad[2345] = 50257  # the first id past the vocabulary
shard(f"{sys.argv[1]}/train_000001.bin", bad)
shard(f"{sys.argv[1]}/val_000000.bin", good)
PY
status=0
"$bin" -e tiny -b 2 -t 32 -x 2 -v 0 -s 0 -i "$dir/train_*.bin" -j "$dir/val_*.bin" > "$dir/out" 2> "$dir/err" || status=$?
cat "$dir/err"
test "$status" -ne 0 || { echo "data check: expected a failure, got exit status 0"; exit 1; }
grep -q "train_000001.bin': token 50257 at index 2345 (byte 5714) is not below the vocabulary size 50257" "$dir/err" ||
    { echo "data check: no error line naming the shard, index and token"; exit 1; }
if grep -q "^step " "$dir/out"; then echo "data check: a step ran before the bad token was found"; exit 1; fi
echo "data check: the bad token stopped the run before its first step (status $status)"
