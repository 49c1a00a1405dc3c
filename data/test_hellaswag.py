#!/usr/bin/env python3
"""Checks data/hellaswag.py: the eval file's bytes for a hand-written jsonl (the committed fixture
test/fixtures/hellaswag_tiny.jsonl -> .bin), and one-line errors on bad input.
Run: python3 data/test_hellaswag.py (needs scripts/install_python_deps.sh)."""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "test", "fixtures")
sys.path.insert(0, HERE)
import prepare  # noqa: E402

# GPT-2 ids also checked in data/test_prepare.py (three tokenizers agree on them).
HELLO_WORLD = [15496, 995, 0]                          # "Hello world!"
THE_QUICK_BROWN_FOX = [383, 2068, 7586, 21831]         # " The quick brown fox"
JUMPS_OVER = [18045, 625, 262, 16931, 3290, 13]        # " jumps over the lazy dog."


def parse_eval_file(raw):
    """Independent reader: header fields, then per example (index, label, context, completions)."""
    magic, version, count, longest = struct.unpack_from("<4i", raw)
    assert struct.unpack_from("<252i", raw, 16) == (0,) * 252, "reserved header words"
    values = struct.unpack_from(f"<{(len(raw) - 1024) // 2}H", raw, 1024)
    examples, at = [], 0
    for _ in range(count):
        start = at
        delimiter, length, index, label, completions = values[at:at + 5]
        assert delimiter == 65535
        at += 5
        runs = []
        for _ in range(1 + completions):
            n = values[at]
            runs.append(list(values[at + 1:at + 1 + n]))
            at += 1 + n
        assert length == 2 * (at - start), (length, at - start)
        examples.append({"index": index, "label": label, "context": runs[0], "completions": runs[1:],
                         "bytes": length})
    assert at == len(values), "trailing values"
    return (magic, version, count, longest), examples


class HellaSwagTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.encoding = prepare.load_gpt2_encoding()

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def run_cli(self, *args):
        return subprocess.run([sys.executable, os.path.join(HERE, "hellaswag.py"), *args],
                              capture_output=True, text=True)

    def test_tiny_jsonl_gives_the_committed_fixture_byte_for_byte(self):
        jsonl = os.path.join(FIXTURES, "hellaswag_tiny.jsonl")
        out = os.path.join(self.tmp.name, "tiny.bin")
        result = self.run_cli("--input", jsonl, "--out", out)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(out, "rb") as f:
            raw = f.read()
        with open(os.path.join(FIXTURES, "hellaswag_tiny.bin"), "rb") as f:
            self.assertEqual(raw, f.read(), "regenerate: python3 data/hellaswag.py --input "
                             "test/fixtures/hellaswag_tiny.jsonl --out test/fixtures/hellaswag_tiny.bin")

        header, examples = parse_eval_file(raw)
        self.assertEqual(header, (20240522, 1, 3, max(e["bytes"] for e in examples)))
        with open(jsonl, encoding="utf-8") as f:
            items = [json.loads(line) for line in f]
        for i, (example, item) in enumerate(zip(examples, items)):
            self.assertEqual(example["index"], i)
            self.assertEqual(example["label"], item["label"])
            self.assertEqual(example["context"], self.encoding.encode_ordinary(item["ctx"]))
            self.assertEqual(example["completions"], [self.encoding.encode_ordinary(" " + e) for e in item["endings"]])
            self.assertEqual(example["bytes"], 2 * (5 + 1 + len(example["context"]) +
                                                   sum(1 + len(c) for c in example["completions"])))
        # Known ids: the context as is, each ending with its leading space.
        self.assertEqual(examples[0]["context"], HELLO_WORLD)
        self.assertEqual(examples[0]["completions"][:2], [THE_QUICK_BROWN_FOX, JUMPS_OVER])
        self.assertEqual([e["label"] for e in examples], [1, 0, 3])

    def test_bad_input_fails_with_one_line_naming_the_line(self):
        good = {"ctx": "A man", "endings": ["walks.", "runs."], "label": 1}
        cases = [(["not json"], "line 2: not JSON"),
                 ([dict(good, label=2)], "line 2: 'label'"),
                 ([dict(good, label=True)], "line 2: 'label'"),
                 ([dict(good, ctx="")], "line 2: 'ctx'"),
                 ([dict(good, endings=[])], "line 2: 'endings'"),
                 ([dict(good, endings=["a", ""])], "line 2: 'endings'")]
        for lines, expected in cases:
            path = os.path.join(self.tmp.name, "bad.jsonl")
            with open(path, "w", encoding="utf-8") as f:
                f.write(json.dumps(good) + "\n")
                for line in lines:
                    f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
            result = self.run_cli("--input", path, "--out", os.path.join(self.tmp.name, "out.bin"))
            self.assertNotEqual(result.returncode, 0, expected)
            self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
            self.assertIn(f"hellaswag.py: --input {path}: {expected}", result.stderr)
            self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "out.bin")))
        result = self.run_cli("--input", os.path.join(self.tmp.name, "missing.jsonl"), "--out", "x.bin")
        self.assertIn("No such file", result.stderr)


if __name__ == "__main__":
    unittest.main()
