#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora (test/fuzz/corpus/<target>/): one small valid file per reader, in
the formats host/ reads (llm.c's model, shard, tokenizer and HellaSwag files; our state file, version
2 with its CRC-32C records; a --config JSON). Committed; rerun after a format change."""
import json, os, shutil, struct, sys

here = os.path.dirname(os.path.abspath(__file__))

def crc32c(data):  # Castagnoli, reflected 0x82F63B78; check value crc32c(b"123456789") == 0xE3069283
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

assert crc32c(b"123456789") == 0xE3069283

def write(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

# Model: maxT 2, V 5, Vp 8, L 1, NH 1, C 4 (fp32, version 3): Vp*C + maxT*C + L*(12 C^2 + 13 C) + 2 C.
maxT, V, Vp, L, NH, C = 2, 5, 8, 1, 1, 4
n = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
params = struct.pack(f"<{n}f", *[(i % 7) * 0.125 - 0.375 for i in range(n)])
header = [20240326, 3, maxT, V, L, NH, C, Vp, 1, struct.unpack("<i", struct.pack("<I", crc32c(params)))[0]] + [0] * 246
write("model_file", "tiny_fp32.bin", struct.pack("<256i", *header) + params)

# State, version 2: 16 parameters written by 2 ranks (records [0, 8) and [8, 16)).
N, meta = 16, b'{"run_id":"seed"}'
align = lambda x, a: (x + a - 1) // a * a
checksum_offset = align(2048 + len(meta), 8)
master_offset = align(checksum_offset + 2 * 40, 64)
m_offset, v_offset = master_offset + 4 * N, master_offset + 8 * N
file_bytes = master_offset + 12 * N
arrays = [[0.5 + i for i in range(N)], [0.01 * i for i in range(N)], [0.001 * i for i in range(N)]]
words = [20261122, 2, 2048, 7, N, 1, 2, 3, 4, 0, 0, 6, len(meta), 2048, master_offset, m_offset, v_offset, file_bytes,
         2, checksum_offset] + [0] * 236
body = bytearray(struct.pack("<256Q", *words)) + meta
body += b"\0" * (checksum_offset - len(body))
for begin in (0, 8):
    crcs = [crc32c(struct.pack("<8f", *a[begin:begin + 8])) for a in arrays]
    body += struct.pack("<5Q", begin, 8, *crcs)
body += b"\0" * (master_offset - len(body))
for a in arrays:
    body += struct.pack(f"<{N}f", *a)
assert len(body) == file_bytes
write("state_file", "two_writers.bin", bytes(body))

# Shard (llm.c: magic 20240520, version 1, token count; uint16 tokens).
tokens = [(i * 37) % 50257 for i in range(40)]
write("shard", "train_000000.bin", struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)) + struct.pack(f"<{len(tokens)}H", *tokens))

# Tokenizer, version 2: vocab 4, EOT 3; each token a length byte and its bytes.
pieces = [b"a", b"bc", b" the", b"<|endoftext|>"]
write("tokenizer", "version2.bin",
      struct.pack("<256I", 20240328, 2, len(pieces), 3, *([0] * 252)) + b"".join(bytes([len(p)]) + p for p in pieces))

# HellaSwag: the test suite's 3-example fixture.
d = os.path.join(here, "corpus", "hellaswag")
os.makedirs(d, exist_ok=True)
shutil.copy(os.path.join(here, "..", "fixtures", "hellaswag_tiny.bin"), os.path.join(d, "tiny.bin"))

# A --config file with a value of every kind (numbers, strings, booleans) and a cross-flag rule in play.
write("config", "run.json", json.dumps({"model": "tiny", "batch-size": 2, "seq-len": 32, "learning-rate": 1e-3,
                                        "lr-schedule": "wsd", "output-dir": "out", "checkpoint-every": 5,
                                        "keep-last": 2, "skip-loss-z": 3.5, "json": False, "attention": "auto",
                                        "on-divergence": "rollback"}, indent=1).encode())
# The autotune picks file (host/matmul_algos.h): two picks, one of them with a uint32 field at its largest.
fields = ["transa", "transb", "m", "n", "k", "lda", "ldb", "ldd", "accumulate", "epilogue", "bias_type", "align_a",
          "align_b", "align_d", "align_bias", "align_aux"]
picks = [dict(zip(fields, [0, 1, 768, 2304, 65536, 768, 2304, 768, 1, 8, -1, 256, 256, 256, 0, 0]), algo="0" * 127 + "1"),
         dict(zip(fields, [1, 0, 2304, 65536, 768, 768, 768, 2304, 0, 4294967295, 14, 16, 256, 256, 16, 256]),
              algo="0123456789abcdef" * 8)]
write("matmul_algos", "two_picks.json", json.dumps({"format": "train_gpt matmul algorithms 1", "library": "cuBLASLt 130100",
                                                    "device": "NVIDIA H100 80GB HBM3", "precision": "BF16", "picks": picks},
                                                   indent=1).encode())
print("fuzz seeds written to", os.path.join(here, "corpus"))
