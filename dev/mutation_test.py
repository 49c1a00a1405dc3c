#!/usr/bin/env python3
"""Mutation score of the test suite: does every planted fault make some test fail?

Each file in dev/mutations/*.mut plants one fault, as sed expressions applied to one source file:

    fault: causal mask off by one (a query also sees the next key)
    file: kernels/attention.cuh
    sed: s/k0 + key_col <= query/k0 + key_col <= query + 1/
    lines: 1                       # lines the fault changes (default 1); anything else is an error
    build: test_kernel_attention test_kernel_attention_fp32     # make targets, in build/cpu/
                                   # (make:NAME: the plain make target NAME, e.g. make:no-mpi-check-build)
    tests: ^test_kernel_attention(_fp32)?_(forward|reverse|random)$   # the CTest names that should notice

For each mutant: a scratch copy of the tree (build/mutation/tree: git's tracked and untracked,
not ignored, files) gets the pristine file, then the fault; `make` rebuilds the named targets there
(a fault that does not compile is an error, not a catch), and CTest runs the named tests. The
fault is caught when at least one of them fails (or times out). Before any fault, the same tests
must pass on the pristine tree, or nothing a mutant does would mean anything.

Prints a table (fault, file, caught by, seconds) and the score, also written to
build/mutation/report.md; exits 1 unless every fault was caught.

    make mutation-test                                 # all faults
    python3 dev/mutation_test.py --check               # only: does every fault still apply?
    python3 dev/mutation_test.py attention_mask adamw  # those whose file name contains a word
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTATIONS = ROOT / "dev" / "mutations"
WORK = ROOT / "build" / "mutation"
TREE = WORK / "tree"
BUILD_DIR = "build/cpu"  # the Makefile's CPU_DIR for BUILD=build PRECISION=BF16
TEST_TIMEOUT_S = 600     # a hung test counts as caught (it would time out in CI too)


class Mutant:
    def __init__(self, path):
        self.path = path
        self.name = path.stem
        self.seds, self.lines = [], 1
        fields = {}
        for number, raw in enumerate(path.read_text().splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition(":")
            if not sep or key not in ("fault", "file", "sed", "lines", "build", "tests"):
                sys.exit(f"{path}:{number}: expected 'fault|file|sed|lines|build|tests: ...', got '{raw}'")
            value = value.strip()
            if key == "sed":
                self.seds.append(value)
            else:
                fields[key] = value
        for key in ("fault", "file", "build", "tests"):
            if key not in fields:
                sys.exit(f"{path}: the field '{key}' is missing")
        if not self.seds:
            sys.exit(f"{path}: no 'sed:' line")
        self.fault, self.file = fields["fault"], fields["file"]
        self.targets = fields["build"].split()
        self.tests = fields["tests"]
        if "lines" in fields:
            self.lines = int(fields["lines"])


def run(cmd, log, **kwargs):
    with open(log, "a") as f:
        f.write(f"$ {' '.join(map(str, cmd))}\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, **kwargs).returncode


def sync_tree():
    """Copy git's tracked and untracked-but-not-ignored files into TREE (build/ there is kept)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src, dst = ROOT / rel, TREE / rel
        if not src.is_file():
            continue  # deleted in the working tree
        if dst.exists() and dst.stat().st_size == src.stat().st_size and dst.read_bytes() == src.read_bytes():
            continue  # unchanged: keep its time stamp, so make does not rebuild for nothing
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        os.utime(dst)  # newer than anything built from the old copy


PRISTINE = {}  # file -> its bytes when the run began: edits to the working tree meanwhile do not leak in


def restore(rel):
    """The pristine file, with a fresh time stamp if it had been mutated."""
    dst = TREE / rel
    if rel not in PRISTINE:
        PRISTINE[rel] = dst.read_bytes()  # first use: the tree was just synced from the working tree
    if dst.read_bytes() != PRISTINE[rel]:
        dst.write_bytes(PRISTINE[rel])
        os.utime(dst)


def build(targets, log):
    paths = [t.removeprefix("make:") if t.startswith("make:") else f"{BUILD_DIR}/{t}" for t in targets]
    return run(["make", "--no-print-directory", "-C", str(TREE), "BUILD=build", "PRECISION=BF16", *paths], log) == 0


def test_numbers(regex):
    """CTest's numbers of the tests whose names match (ctest -N lists them without running)."""
    out = subprocess.run(["ctest", "--test-dir", str(TREE / BUILD_DIR), "-N", "-R", regex], capture_output=True,
                         text=True).stdout
    return {int(n) for n in re.findall(r"Test +#(\d+):", out)}


def ctest(selection, log):
    """Runs the tests matching a regex, or the tests of a set of numbers; (passed, failed test names)."""
    if isinstance(selection, str):
        chosen = ["-R", selection]
    else:  # -I start,end,stride,number...: a union CMake's regex engine could not take (it caps groups)
        chosen = ["-I", "0,0,0," + ",".join(map(str, sorted(selection)))]
    cmd = ["ctest", "--test-dir", str(TREE / BUILD_DIR), *chosen, "-j2", "--timeout", str(TEST_TIMEOUT_S),
           "--no-tests=error", "--output-on-failure"]
    code = run(cmd, log)
    failed_log = TREE / BUILD_DIR / "Testing" / "Temporary" / "LastTestsFailed.log"
    failed = []
    if code != 0 and failed_log.exists():
        failed = [line.split(":", 1)[1].strip() for line in failed_log.read_text().splitlines() if ":" in line]
    return code == 0, failed


def apply(m, log, tree=TREE):
    """Plants the fault in tree; returns an error message, or '' when it changed exactly m.lines lines."""
    target = tree / m.file
    if not target.is_file():
        return f"{m.file} does not exist"
    before = target.read_text().splitlines()
    args = ["sed", "-i"]
    for expression in m.seds:
        args += ["-e", expression]
    if run(args + [str(target)], log) != 0:
        return "sed failed"
    after = target.read_text().splitlines()
    changed = sum(1 for a, b in zip(before, after) if a != b) + abs(len(before) - len(after))
    if changed != m.lines:
        return f"changed {changed} lines of {m.file}, expected {m.lines} (does the rule still match the code?)"
    return ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("only", nargs="*", help="run only the faults whose file name contains one of these")
    parser.add_argument("--check", action="store_true",
                        help="only check that every fault still applies (no build, no test; the suite runs this)")
    args = parser.parse_args()
    mutants = [Mutant(p) for p in sorted(MUTATIONS.glob("*.mut"))]
    if args.only:
        mutants = [m for m in mutants if any(word in m.name for word in args.only)]
    if not mutants:
        sys.exit("mutation_test: no fault selected")
    if args.check:  # each fault on a scratch copy of its one file
        problems = 0
        with tempfile.TemporaryDirectory() as scratch:
            for m in mutants:
                if not (ROOT / m.file).is_file():
                    problem = f"{m.file} does not exist"
                else:
                    (Path(scratch) / m.file).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(ROOT / m.file, Path(scratch) / m.file)
                    problem = apply(m, os.devnull, Path(scratch))
                if problem:
                    problems += 1
                    print(f"{m.name}: {problem}")
        print(f"mutation_test --check: {len(mutants) - problems} of {len(mutants)} faults apply")
        return 1 if problems else 0

    WORK.mkdir(parents=True, exist_ok=True)
    log = WORK / "log.txt"
    log.write_text("")
    print(f"mutation_test: {len(mutants)} faults; build and test output in {log.relative_to(ROOT)}", flush=True)
    sync_tree()
    for m in mutants:
        restore(m.file)  # records each file's pristine bytes
    # CTest's test list, as make test writes it (the suite's one description, test/tests.cmake).
    if run(["make", "--no-print-directory", "-C", str(TREE), "BUILD=build", "PRECISION=BF16",
            f"{BUILD_DIR}/CTestTestfile.cmake"], log) != 0:
        sys.exit(f"mutation_test: could not write the CTest file (see {log})")
    # Baseline: every target builds and every named test passes without a fault.
    all_targets = sorted({t for m in mutants for t in m.targets})
    start = time.time()
    if not build(all_targets, log):
        sys.exit(f"mutation_test: the pristine tree does not build (see {log})")
    all_tests = set()
    for m in mutants:
        numbers = test_numbers(m.tests)
        if not numbers:
            sys.exit(f"mutation_test: {m.name}: no test matches '{m.tests}'")
        all_tests |= numbers
    passed, failed = ctest(all_tests, log)
    if not passed:
        sys.exit(f"mutation_test: tests fail without any fault: {', '.join(failed) or 'see ' + str(log)}")
    print(f"baseline: {len(all_targets)} targets built and their tests pass ({time.time() - start:.0f} s)", flush=True)

    rows, caught, errors = [], 0, 0
    for i, m in enumerate(mutants, 1):
        start = time.time()
        with open(log, "a") as f:
            f.write(f"\n===== {m.name}: {m.fault}\n")
        restore(m.file)
        problem = apply(m, log)
        verdict, by = "", ""
        if problem:
            verdict, errors = "ERROR", errors + 1
            by = problem
        elif not build(m.targets, log):
            verdict, errors = "ERROR", errors + 1
            by = "the mutant does not build"
        else:
            passed, failed = ctest(m.tests, log)
            if passed:
                verdict, by = "MISSED", "no test failed"
            else:
                verdict, caught = "caught", caught + 1
                by = ", ".join(failed[:3]) + (f" +{len(failed) - 3}" if len(failed) > 3 else "")
        restore(m.file)
        seconds = time.time() - start
        rows.append((m.name, m.fault, m.file, verdict, by, seconds))
        print(f"[{i}/{len(mutants)}] {verdict:6} {m.name}: {m.fault} ({seconds:.0f} s) {by}", flush=True)

    # Leave the tree's binaries pristine for the next run.
    build(all_targets, log)
    score = 100.0 * caught / len(mutants)
    table = ["| fault | what it plants | file | result | failing tests | s |", "|---|---|---|---|---|---|"]
    table += [f"| {n} | {fault} | `{file}` | {v} | {by} | {s:.0f} |" for n, fault, file, v, by, s in rows]
    summary = f"mutation score: {caught}/{len(mutants)} faults caught ({score:.1f}%)" + (
        f", {errors} could not be planted or built" if errors else "")
    report = "\n".join(table + ["", summary]) + "\n"
    (WORK / "report.md").write_text(report)
    print("\n" + report, flush=True)
    return 0 if caught == len(mutants) else 1


if __name__ == "__main__":
    sys.exit(main())
