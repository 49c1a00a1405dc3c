#!/usr/bin/env python3
"""scripts/profile_delta.py on the H100 profile of 2026-11-27 (docs/gpu_check_2026-11-27_h100): against
itself every kernel's change is zero; against an edited copy (one kernel faster, one renamed by a
template argument, one gone, one new, a faster step with a host line) each shows as it should, with
the step's time outside the kernels, in the printed table and in --json;
a file without a --profile-step table is refused with exit code 1."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "profile_delta.py")
BASELINE = os.path.join(ROOT, "docs", "gpu_check_2026-11-27_h100", "profile.json")


def run(before, after, *more):
    return subprocess.run([sys.executable, SCRIPT, before, after, *more], capture_output=True, text=True)


with tempfile.TemporaryDirectory() as tmp:
    rows_json = os.path.join(tmp, "rows.json")
    same = run(BASELINE, BASELINE, "--json", rows_json)
    assert same.returncode == 0, same.stderr
    rows = json.load(open(rows_json))["rows"]
    assert len(rows) == 32, len(rows)  # the table's kernel rows, "total (all streams)" not among them
    assert all(r["change_ms"] == 0.0 and r["ms_before"] == r["ms_after"] for r in rows), rows
    by_name = {r["kernel"]: r for r in rows}
    assert by_name["fused_classifier_kernel"]["ms_before"] == 6.691, by_name["fused_classifier_kernel"]
    assert "all kernels" in same.stdout and "127.415" in same.stdout, same.stdout
    assert same.stdout.count("measured (wall clock") == 2, same.stdout
    # The step outside its kernels: 135 ms of wall clock (0.135 s/step) less 127.415 ms of kernels; that
    # profile predates the host line.
    totals = json.load(open(rows_json))
    assert totals["step_ms"] == [135.0, 135.0], totals["step_ms"]
    assert all(abs(x - 7.585) < 1e-9 for x in totals["outside_kernels_ms"]), totals["outside_kernels_ms"]
    assert totals["host_upload_ms"] == [None, None], totals["host_upload_ms"]

    # The edited copy: the classifier 6.691 -> 4.900 ms, the row-dot renamed with <true>, the wpe
    # gradient gone, a combining kernel new.
    data = json.load(open(BASELINE))
    report = []
    for line in data["report"]:
        if line.startswith("fused_classifier_kernel "):
            line = line.replace("      6.691 ", "      4.900 ")
        if line.startswith("attention_backward_rowdot_kernel "):
            line = line.replace("attention_backward_rowdot_kernel      ", "attention_backward_rowdot_kernel<true>")
        if line.startswith("encoder_backward_wpe_kernel "):
            line = line.replace("encoder_backward_wpe_kernel ", "encoder_backward_combine_kernel ")
        if line.startswith("measured (wall clock"):
            line = line.replace("0.135 s/step", "0.130 s/step")
        report.append(line)
    report.append("host: 0.400 ms of the step in 1 batch upload (checks, page-locked copies, encoder grouping), "
                  "before the micro-step's launches")
    assert report != data["report"]
    edited = os.path.join(tmp, "edited.json")
    json.dump({"report": report}, open(edited, "w"))
    delta = run(BASELINE, edited, "--json", rows_json)
    assert delta.returncode == 0, delta.stderr
    rows = json.load(open(rows_json))["rows"]
    by_name = {r["kernel"]: r for r in rows}
    classifier = by_name["fused_classifier_kernel"]
    assert abs(classifier["change_ms"] - (4.900 - 6.691)) < 1e-9, classifier
    assert rows[0]["kernel"] == "fused_classifier_kernel", rows[0]  # the largest change first
    rowdot = by_name["attention_backward_rowdot_kernel<true>"]
    assert rowdot["before_name"] == "attention_backward_rowdot_kernel" and rowdot["change_ms"] == 0.0, rowdot
    assert by_name["encoder_backward_wpe_kernel"]["ms_after"] is None, by_name["encoder_backward_wpe_kernel"]
    assert by_name["encoder_backward_combine_kernel"]["ms_before"] is None, by_name["encoder_backward_combine_kernel"]
    assert "(was attention_backward_rowdot_kernel)" in delta.stdout, delta.stdout
    assert "-1.791" in delta.stdout, delta.stdout
    # 130 ms of wall clock less 125.624 ms of kernels; 0.4 ms of it host uploads.
    totals = json.load(open(rows_json))
    assert totals["step_ms"] == [135.0, 130.0], totals["step_ms"]
    assert abs(totals["outside_kernels_ms"][1] - (130.0 - (127.415 - 1.791))) < 1e-6, totals["outside_kernels_ms"]
    assert totals["host_upload_ms"] == [None, 0.4], totals["host_upload_ms"]
    assert "  of it host uploads" in delta.stdout and "0.400" in delta.stdout, delta.stdout

    # No table: refused, naming the file.
    empty = os.path.join(tmp, "empty.log")
    open(empty, "w").write("train_gpt: nothing profiled\n")
    refused = run(BASELINE, empty)
    assert refused.returncode == 1 and "empty.log: no kernel rows" in refused.stderr, (refused.returncode, refused.stderr)
print("profile_delta: 4 checks passed")
