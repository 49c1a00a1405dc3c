#!/usr/bin/env python3
"""Per-kernel change between two `--profile-step` tables: a GPU check's profile.json (its "report"
lines) or a saved log of `train_gpt --profile-step`, before and after.

    scripts/profile_delta.py docs/gpu_check_2026-11-27_h100/profile.json out/gpu_check/profile.json
    scripts/profile_delta.py BEFORE AFTER --json out/gpu_check/profile_delta.json

Prints one row per kernel: its measured ms before and after and the change, the largest changes
first; then the step's wall clock, its time outside the kernels (the wall clock minus the kernels'
sum: host work the device waited for, launch gaps, memsets) and the host's batch uploads within it
(the `host:` line; "-" where a profile predates that line); then the measured step lines of both.
A kernel is matched by its name; one that was renamed by a template argument only ("attention_backward_rowdot_kernel" -> "..._kernel<true>") is matched by
the name before its "<" when that pairs exactly one row of each table. A kernel in one table only
is listed with "-" for the other. Exits 1 when either table has no kernel rows.
"""
import argparse
import json
import re
import signal
import sys

UNITS = ("simt", "tensor", "cublasLt", "nccl", "memset", "copy", "pcie")
# name (may hold spaces: template arguments), unit, launches, GFLOP, GB, FLOP/B, est ms, bound, measured ms, ...
STEP = re.compile(r"^measured \(wall clock[^)]*\): ([0-9.]+) s/step")
HOST = re.compile(r"^host: ([0-9.]+) ms of the step")
ROW = re.compile(r"^(\S.*?)\s+(" + "|".join(UNITS) + r")\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+(\S+)\s+([0-9.]+)\s")


def report_lines(path):
    """The table's lines: a profile.json's "report", or the lines of a log."""
    with open(path, errors="replace") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except ValueError:
        return text.splitlines()
    if not isinstance(data, dict) or not isinstance(data.get("report"), list):
        sys.exit(f"profile_delta: {path}: a JSON file without a \"report\" list of lines")
    return data["report"]


def parse(path):
    """{kernel: (launches, estimate ms, measured ms)}, the measured step lines, and the step's and the
    host uploads' ms (None when the table has no such line)."""
    rows, steps, step_ms, host_ms = {}, [], None, None
    for line in report_lines(path):
        if line.startswith("measured (wall clock"):
            steps.append(line)
        if m := STEP.match(line):
            step_ms = 1e3 * float(m.group(1))
        if m := HOST.match(line):
            host_ms = float(m.group(1))
        m = ROW.match(line)
        if m and not m.group(1).startswith("total"):
            rows[m.group(1)] = (int(m.group(3)), float(m.group(7)), float(m.group(9)))
    if not rows:
        sys.exit(f"profile_delta: {path}: no kernel rows (a --profile-step table was expected)")
    return rows, steps, step_ms, host_ms


def base(name):
    return name.split("<", 1)[0]


def pair(before, after):
    """(name before or None, name after or None) for every kernel of either table."""
    pairs = [(n, n) for n in before if n in after]
    only_before = [n for n in before if n not in after]
    only_after = [n for n in after if n not in before]
    for n in list(only_before):
        same_before = [m for m in only_before if base(m) == base(n)]
        same_after = [m for m in only_after if base(m) == base(n)]
        if len(same_before) == 1 and len(same_after) == 1:
            pairs.append((n, same_after[0]))
            only_before.remove(n)
            only_after.remove(same_after[0])
    return pairs + [(n, None) for n in only_before] + [(None, n) for n in only_after]


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    before, before_steps, before_step_ms, before_host_ms = parse(args.before)
    after, after_steps, after_step_ms, after_host_ms = parse(args.after)
    rows = []
    for b, a in pair(before, after):
        ms_before = before[b][2] if b else None
        ms_after = after[a][2] if a else None
        change = (ms_after or 0.0) - (ms_before or 0.0)
        rows.append({"kernel": a or b, "before_name": b, "ms_before": ms_before, "ms_after": ms_after, "change_ms": change})
    rows.sort(key=lambda r: (-abs(r["change_ms"]), r["kernel"]))
    width = max(len(r["kernel"]) for r in rows)
    print(f"{'kernel':<{width}}  {'before ms':>10}  {'after ms':>10}  {'change':>9}")
    fmt = lambda v: f"{v:10.3f}" if v is not None else f"{'-':>10}"
    for r in rows:
        renamed = f"  (was {r['before_name']})" if r["before_name"] and r["before_name"] != r["kernel"] else ""
        print(f"{r['kernel']:<{width}}  {fmt(r['ms_before'])}  {fmt(r['ms_after'])}  {r['change_ms']:+9.3f}{renamed}")
    total_before = sum(v[2] for v in before.values())
    total_after = sum(v[2] for v in after.values())
    print(f"{'all kernels':<{width}}  {total_before:10.3f}  {total_after:10.3f}  {total_after - total_before:+9.3f}")
    outside_before = before_step_ms - total_before if before_step_ms is not None else None
    outside_after = after_step_ms - total_after if after_step_ms is not None else None
    for label, b, a in (("step (wall clock)", before_step_ms, after_step_ms),
                        ("outside the kernels", outside_before, outside_after),
                        ("  of it host uploads", before_host_ms, after_host_ms)):
        change = f"{a - b:+9.3f}" if a is not None and b is not None else f"{'-':>9}"
        print(f"{label:<{width}}  {fmt(b)}  {fmt(a)}  {change}")
    for label, steps in (("before", before_steps), ("after", after_steps)):
        for line in steps:
            print(f"{label}: {line}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"before": args.before, "after": args.after, "rows": rows, "all_kernels_ms": [total_before, total_after],
                       "step_ms": [before_step_ms, after_step_ms], "outside_kernels_ms": [outside_before, outside_after],
                       "host_upload_ms": [before_host_ms, after_host_ms],
                       "steps_before": before_steps, "steps_after": after_steps}, f, indent=1)


if __name__ == "__main__":
    main()
