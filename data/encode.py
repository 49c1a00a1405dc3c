#!/usr/bin/env python3
"""Prints the GPT-2 BPE token ids of a text, space-separated, on one line: the prompt encoder of
train_gpt --generate --prompt TEXT.

    python3 data/encode.py TEXT

The text is encoded exactly as data/prepare.py encodes a document of the training data (the same
packaged, hash-checked BPE files through tiktoken; a literal "<|endoftext|>" is text, not a token).
The end-of-text token the training data puts before every document is not printed: train_gpt adds it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prepare  # noqa: E402  (beside this file)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("encode.py: expected one argument, the text to encode")
    ids = prepare.load_gpt2_encoding().encode_ordinary(argv[0])
    print(" ".join(str(i) for i in ids))


if __name__ == "__main__":
    main()
