#!/usr/bin/env python3
"""Checks data/prepare.py on parquet input (FineWeb's format): token ids row group by row group,
worker-count independence, resuming after a kill, bad files. Needs pyarrow (not in
data/requirements.txt): without it this reports SKIPPED (exit status 77) instead of passing.
Run: python3 data/test_prepare_parquet.py"""
import os
import shutil
import signal
import sys
import unittest

try:
    import pyarrow
    import pyarrow.parquet
except ImportError:
    print("SKIPPED: pyarrow is not installed (python3 -m pip install pyarrow); parquet input untested")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import prepare  # noqa: E402
from test_prepare import (TempDirTest, expected_stream, prepare_cli, read_output, read_split,  # noqa: E402
                          run_prepare, synthetic_texts)


class ParquetTest(TempDirTest):
    def write_parquet(self, name, columns, row_group_size):
        path = self.path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pyarrow.parquet.write_table(pyarrow.table(columns), path, row_group_size=row_group_size)
        return path

    def fineweb_like(self, name, texts, row_group_size=7, text_type=None):
        """FineWeb's layout: text first, then metadata columns."""
        return self.write_parquet(name, {
            "text": pyarrow.array(texts, type=text_type or pyarrow.string()),
            "id": [f"<urn:uuid:{i}>" for i in range(len(texts))],
            "token_count": [len(t) for t in texts],
        }, row_group_size)

    def test_rows_tokenize_in_order_across_row_groups_and_files(self):
        texts = synthetic_texts(70, seed=11)
        texts[5] = ""  # empty rows are skipped and counted
        first = self.fineweb_like("data/000_00000.parquet", texts[:50])
        self.fineweb_like("data/001_00000.parquet", texts[50:], row_group_size=1000, text_type=pyarrow.large_string())
        self.assertEqual(pyarrow.parquet.ParquetFile(first).metadata.num_row_groups, 8)
        summary = run_prepare(self.out, inputs=[self.path("data/*.parquet")], shard_tokens=128, val_tokens=300)
        val, train = read_split(self.out, "val"), read_split(self.out, "train")
        kept = [t for t in texts if t]
        self.assertEqual(sum(val + train, []), expected_stream(self.encoding, kept))
        self.assertTrue(all(len(s) == 128 for s in val[:-1] + train[:-1]))
        self.assertEqual((summary["documents"], summary["empty_documents"]), (69, 1))
        self.assertGreaterEqual(summary["val_tokens"], 300)
        self.assertEqual(val[0][0], prepare.EOT)

    def test_workers_and_mixed_formats_give_the_same_bytes(self):
        texts = synthetic_texts(90, seed=12)
        inputs = [self.fineweb_like("a.parquet", texts[:60], row_group_size=9), self.write_jsonl("b.jsonl", texts[60:])]
        outputs = []
        for workers in (1, 2):
            out = self.path(f"out{workers}")
            run_prepare(out, inputs=inputs, shard_tokens=200, val_tokens=400, workers=workers, chunk_bytes=500)
            outputs.append(read_output(out))
        self.assertEqual(outputs[0], outputs[1])
        self.assertEqual(sum(read_split(self.path("out1"), "val") + read_split(self.path("out1"), "train"), []),
                         expected_stream(self.encoding, texts))

    def test_kill_then_rerun_gives_identical_bytes(self):
        path = self.fineweb_like("c.parquet", synthetic_texts(120, seed=13), row_group_size=10)
        args = ["--out", self.out, "--input", path, "--shard-tokens", "300", "--val-tokens", "900", "--workers", "2"]
        reference = self.path("reference")
        run_prepare(reference, inputs=[path], shard_tokens=300, val_tokens=900)
        for hook in ("2", "5:unrecorded"):
            with self.subTest(hook=hook):
                killed = prepare_cli(*args, env=dict(os.environ, **{prepare.KILL_HOOK: hook}))
                self.assertEqual(killed.returncode, -signal.SIGKILL, killed.stderr)
                resumed = prepare_cli(*args)
                self.assertEqual(resumed.returncode, 0, resumed.stderr)
                self.assertIn("prepare.py: resuming", resumed.stdout)
                self.assertEqual(read_output(self.out), read_output(reference))
                shutil.rmtree(self.out)

    def test_bad_parquet_names_the_file_and_the_problem(self):
        texts = ["a document", None, "another"]
        cases = [
            (self.fineweb_like("nocol.parquet", ["x"]), ["--text-field", "content"],
             "nocol.parquet: no column 'content' (it has: text, id, token_count)"),
            (self.write_parquet("ints.parquet", {"text": [1, 2]}, 10), [],
             "ints.parquet: column 'text' holds int64, not text"),
            (self.write_parquet("null.parquet", {"text": texts}, 2), [], "null.parquet: row 1: 'text' is null"),
            (self.write_file("fake.parquet", "not parquet"), [], "fake.parquet: not a readable parquet file"),
        ]
        for path, extra, message in cases:
            with self.subTest(path=path):
                result = prepare_cli("--out", self.out, "--input", path, *extra)
                self.assert_one_line_error(result, message)
                self.assertIn(path, result.stderr)
                self.assertFalse(os.path.exists(self.out))


if __name__ == "__main__":
    unittest.main()
