#!/usr/bin/env python3
"""Token shards of random GPT-2 ids for the program-level tests: DIR/train_000000.bin and
DIR/val_000000.bin in llm.c's format (256 int32 header: magic 20240520, version 1, token count;
then uint16 tokens), the same tokens in both.

    python3 test/make_shards.py DIR SEED TOKENS
"""
import random
import struct
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    directory, seed, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    random.seed(seed)
    tokens = [random.randrange(50257) for _ in range(count)]
    for name in ("train_000000.bin", "val_000000.bin"):
        with open(f"{directory}/{name}", "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
            f.write(struct.pack(f"<{len(tokens)}H", *tokens))


if __name__ == "__main__":
    main()
