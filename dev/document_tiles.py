#!/usr/bin/env python3
"""How much attention work --doc-mask skips on a token shard: the tile pairs the flash attention kernels
visit with the document mask, against plain causal attention, by the kernels' own rules
(kernels/attention.cuh, kernels/attention_tc.cuh).

    python3 dev/document_tiles.py data/shakespeare/train_000000.bin -t 1024 [--rows 2000]

Rows are T consecutive tokens from the start of the shard (the data loader's windows, unshuffled).
A token's document starts at the last EOT (50256) at or before it, or at the row's start
(host/documents.h). Forward and dQ: a query tile visits the key tiles from the one holding its first
query's document start up to the diagonal; dK/dV: a key tile visits the query tiles from its own up to
the first query whose document starts after its last key. Tiles: SIMT 32 x 32 everywhere; tensor cores
64 queries x 64 keys (forward; dQ and dK/dV too at head size 64, GPT-2's).
"""
import argparse
import struct
import sys

EOT = 50256


def read_shard(path):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        if header[0] != 20240520:
            sys.exit(f"{path}: not an llm.c token shard (magic {header[0]})")
        count = header[2]
        data = f.read(2 * count)
    return struct.unpack(f"<{count}H", data)


def starts_of(row):
    starts, start = [], 0
    for t, token in enumerate(row):
        if token == EOT:
            start = t
        starts.append(start)
    return starts


def query_side(starts, T, rows, tile):  # forward and dQ: (visited, causal) tile pairs
    visited = causal = 0
    for q0 in range(0, T, rows):
        last = (min(q0 + rows, T) + tile - 1) // tile
        causal += last
        visited += last - starts[q0] // tile
    return visited, causal


def key_side(starts, T, rows, tile):  # dK/dV
    visited = causal = 0
    for k0 in range(0, T, rows):
        last_key = min(k0 + rows, T) - 1
        end = next((q for q in range(k0, T) if starts[q] > last_key), T)
        causal += (T - k0 + tile - 1) // tile
        visited += (end - k0 + tile - 1) // tile
    return visited, causal


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shard")
    parser.add_argument("-t", "--seq-len", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=2000, help="rows to count (at most the shard's)")
    args = parser.parse_args()
    tokens, T = read_shard(args.shard), args.seq_len
    rows = min(args.rows, len(tokens) // T)
    totals = {k: [0, 0] for k in ("simt fwd/dQ", "simt dK/dV", "tc fwd/dQ", "tc dK/dV")}
    documents = 0
    for r in range(rows):
        row = tokens[r * T:(r + 1) * T]
        documents += 1 + sum(1 for t in row[1:] if t == EOT)
        starts = starts_of(row)
        for name, (fn, block, tile) in {"simt fwd/dQ": (query_side, 32, 32), "simt dK/dV": (key_side, 32, 32),
                                        "tc fwd/dQ": (query_side, 64, 64), "tc dK/dV": (key_side, 64, 64)}.items():
            v, c = fn(starts, T, block, tile)
            totals[name][0] += v
            totals[name][1] += c
    print(f"{args.shard}: {rows} rows of T = {T}, {documents / rows:.2f} documents (or parts of one) per row")
    for name, (v, c) in totals.items():
        print(f"  {name:12s} tile pairs visited {v / c:6.1%} of causal ({1 - v / c:.1%} skipped)")


if __name__ == "__main__":
    main()
