#!/usr/bin/env python3
"""Converts HellaSwag jsonl into llm.c's eval file format with the GPT-2 BPE, offline.

    data/hellaswag.py --input hellaswag_val.jsonl --out data/hellaswag_val.bin

The input is the official release (github.com/rowanz/hellaswag, data/hellaswag_val.jsonl: one JSON
object per line with "ctx", "endings" and "label"); fetch it yourself, this script never downloads.
The context is tokenized as is, each ending with a leading space (GPT-2's BPE attaches the space to
the next word; llm.c's dev/data/hellaswag.py does the same). Tokenizer: data/prepare.py's (packaged,
hash-checked GPT-2 files, see data/README.md).

Eval file (llm.c dev/data/data_common.py write_evalfile; read by host/hellaswag.h), little-endian:
256 int32 header [magic 20240522, version 1, example count, longest example in bytes], then per
example uint16 values: 65535, the example's length in bytes (these fields included), its index,
the label, the completion count, the context length and tokens, per completion its length and tokens.
"""
import argparse
import array
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prepare  # noqa: E402

EVAL_MAGIC, EVAL_VERSION = 20240522, 1
DELIMITER = 65535
UINT16_LIMIT = 65536  # the index and the example's byte length are uint16 fields


def fail(message):
    raise SystemExit(f"hellaswag.py: {message}")


def read_examples(path):
    """(label, ctx, endings) per line of a HellaSwag jsonl file; a bad line fails naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        fail(f"--input {path}: {e.strerror}")
    except UnicodeDecodeError as e:
        fail(f"--input {path}: not UTF-8 text (byte {e.start})")
    examples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"--input {path}: line {number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            fail(f"{where}: not JSON ({e.msg})")
        if not isinstance(item, dict):
            fail(f"{where}: expected a JSON object")
        ctx, endings, label = item.get("ctx"), item.get("endings"), item.get("label")
        if not isinstance(ctx, str) or not ctx:
            fail(f"{where}: 'ctx' must be a non-empty string")
        if not isinstance(endings, list) or not endings or not all(isinstance(e, str) and e for e in endings):
            fail(f"{where}: 'endings' must be a list of non-empty strings")
        if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(endings):
            fail(f"{where}: 'label' must be an index into 'endings', got {label!r}")
        examples.append((label, ctx, endings))
    if not examples:
        fail(f"--input {path}: no examples")
    if len(examples) > UINT16_LIMIT:
        fail(f"--input {path}: {len(examples)} examples, more than the format's {UINT16_LIMIT} (uint16 index)")
    return examples


def eval_file_bytes(examples, encoding):
    """The eval file for (label, ctx, endings) examples."""
    body, longest = array.array("H"), 0
    for index, (label, ctx, endings) in enumerate(examples):
        values = [DELIMITER, 0, index, label, len(endings)]
        for tokens in [encoding.encode_ordinary(ctx)] + [encoding.encode_ordinary(" " + e) for e in endings]:
            values += [len(tokens), *tokens]
        length = 2 * len(values)
        if length >= UINT16_LIMIT:
            fail(f"example {index}: {length} bytes do not fit the uint16 length field")
        values[1] = length
        longest = max(longest, length)
        body.extend(values)
    header = array.array("i", [0] * prepare.HEADER_WORDS)
    header[0], header[1], header[2], header[3] = EVAL_MAGIC, EVAL_VERSION, len(examples), longest
    if sys.byteorder == "big":  # the format is little-endian
        header.byteswap(), body.byteswap()
    return header.tobytes() + body.tobytes()


def convert(input_path, out_path):
    examples = read_examples(input_path)
    content = eval_file_bytes(examples, prepare.load_gpt2_encoding())
    if os.path.dirname(out_path):
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
    state = prepare.write_if_changed(out_path, content)
    print(f"hellaswag.py: {len(examples):,} examples -> {out_path} ({len(content):,} bytes, {state})")
    return content


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", required=True, help="HellaSwag jsonl, e.g. hellaswag_val.jsonl")
    parser.add_argument("--out", required=True, help="eval file to write, e.g. data/hellaswag_val.bin")
    args = parser.parse_args(argv)
    convert(args.input, args.out)


if __name__ == "__main__":
    main()
