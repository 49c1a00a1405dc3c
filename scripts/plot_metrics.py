#!/usr/bin/env python3
"""Plot a run's metrics.jsonl (written by train_gpt, host/metrics.h): loss and validation loss
on top, learning rate below, against the optimizer step. Writes a PNG.

    python3 scripts/plot_metrics.py RUN_DIR_OR_METRICS_JSONL [-o plot.png]

Needs matplotlib (optional for the project: pip install matplotlib, or apt install
python3-matplotlib). A resumed run appends to the file, so a step can appear twice: the last
record of each step wins. Unreadable lines (a crash mid-write) are skipped with a warning.
"""
import argparse
import json
import os
import sys


def read_metrics(path):
    """Returns (train, val): {step: record} for step records and {step: val_loss}."""
    train, val = {}, {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                step = int(record["step"])
            except (ValueError, KeyError, TypeError) as e:
                print(f"plot_metrics: {path}:{number}: skipped unreadable line ({e})", file=sys.stderr)
                continue
            if "loss" in record:
                train[step] = record
            elif "val_loss" in record:
                val[step] = record["val_loss"]
    return train, val


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", help="a run's output directory, or its metrics.jsonl")
    parser.add_argument("-o", "--output", help="PNG to write (default: next to metrics.jsonl)")
    args = parser.parse_args()

    path = os.path.join(args.metrics, "metrics.jsonl") if os.path.isdir(args.metrics) else args.metrics
    if not os.path.isfile(path):
        sys.exit(f"plot_metrics: no such file: {path}")
    output = args.output or os.path.join(os.path.dirname(os.path.abspath(path)), "metrics.png")
    train, val = read_metrics(path)
    if not train and not val:
        sys.exit(f"plot_metrics: {path}: no step or validation records")
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_metrics: needs matplotlib (pip install matplotlib, or apt install python3-matplotlib)")

    steps = sorted(train)
    figure, (loss_axes, lr_axes) = plt.subplots(2, 1, sharex=True, figsize=(9, 6), gridspec_kw={"height_ratios": (3, 1)})
    # None (a non-finite loss, written as null) leaves a gap in the curve.
    loss = [train[s]["loss"] if train[s]["loss"] is not None else float("nan") for s in steps]
    loss_axes.plot(steps, loss, linewidth=1, label="train loss")
    if val:
        val_steps = sorted(val)
        val_loss = [val[s] if val[s] is not None else float("nan") for s in val_steps]
        loss_axes.plot(val_steps, val_loss, "o-", markersize=3, label="val loss")
    loss_axes.set_ylabel("loss")
    loss_axes.grid(alpha=0.3)
    loss_axes.legend()
    loss_axes.set_title(os.path.basename(os.path.dirname(os.path.abspath(path))) or path)
    lr_axes.plot(steps, [train[s].get("lr") for s in steps], color="tab:green", linewidth=1)
    lr_axes.set_ylabel("learning rate")
    lr_axes.set_xlabel("step")
    lr_axes.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    lr_axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(output, dpi=120)
    print(f"plot_metrics: wrote {output}")


if __name__ == "__main__":
    main()
