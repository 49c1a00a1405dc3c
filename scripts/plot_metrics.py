#!/usr/bin/env python3
"""Plot a run's metrics.jsonl (written by train_gpt, host/metrics.h) into one PNG: train and
validation loss, learning rate, gradient norm and tokens/s against the optimizer step.

    python3 scripts/plot_metrics.py RUN_DIR_OR_METRICS_JSONL [-o plot.png]

Needs matplotlib: when it is missing the script installs it first with scripts/install_python_deps.sh
(from PyPI, pinned in dev/requirements.txt; --no-install refuses instead). A resumed run appends to
the file, so a step can appear twice: the last record of each step wins. Unreadable lines (a crash
mid-write) are skipped with a warning. train_gpt prints this command after a run's last step.
"""
import argparse
import json
import os
import subprocess
import sys


def read_metrics(path):
    """Returns (train, val): {step: record} for step records and {step: (val_loss, val_tokens)} (tokens None
    in logs older than the field)."""
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
                val[step] = (record["val_loss"], record.get("val_tokens"))
    return train, val


def import_pyplot(no_install):
    """matplotlib.pyplot (Agg backend: no display needed), installing matplotlib first when missing."""
    try:
        import matplotlib
    except ImportError:
        if no_install:
            sys.exit("plot_metrics: needs matplotlib (scripts/install_python_deps.sh installs it)")
        here = os.path.dirname(os.path.abspath(__file__))
        print("plot_metrics: matplotlib is missing; installing it (scripts/install_python_deps.sh, PyPI)", file=sys.stderr)
        env = dict(os.environ, PYTHON=sys.executable)
        if subprocess.call([os.path.join(here, "install_python_deps.sh")], env=env) != 0:
            sys.exit("plot_metrics: installing matplotlib failed (see above)")
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", help="a run's output directory, or its metrics.jsonl")
    parser.add_argument("-o", "--output", help="PNG to write (default: next to metrics.jsonl)")
    parser.add_argument("--no-install", action="store_true", help="fail instead of installing matplotlib")
    args = parser.parse_args()

    path = os.path.join(args.metrics, "metrics.jsonl") if os.path.isdir(args.metrics) else args.metrics
    if not os.path.isfile(path):
        sys.exit(f"plot_metrics: no such file: {path}")
    output = args.output or os.path.join(os.path.dirname(os.path.abspath(path)), "metrics.png")
    train, val = read_metrics(path)
    if not train and not val:
        sys.exit(f"plot_metrics: {path}: no step or validation records")
    plt = import_pyplot(args.no_install)

    steps = sorted(train)
    figure, axes = plt.subplots(4, 1, sharex=True, figsize=(9, 10), gridspec_kw={"height_ratios": (3, 1, 1, 1)})
    loss_axes, lr_axes, norm_axes, speed_axes = axes
    # None (a non-finite value, written as null) leaves a gap in a curve.
    series = lambda key: [train[s].get(key) if train[s].get(key) is not None else float("nan") for s in steps]
    loss_axes.plot(steps, series("loss"), linewidth=1, label="train loss")
    # Validations over different token counts (make train's curve over a few batches, its last over the
    # whole split) are separate series, each labelled with its count: their losses are not one curve.
    by_tokens = {}
    for s in sorted(val):
        by_tokens.setdefault(val[s][1], []).append(s)
    for i, (tokens, val_steps) in enumerate(sorted(by_tokens.items(), key=lambda item: -len(item[1]))):
        val_loss = [val[s][0] if val[s][0] is not None else float("nan") for s in val_steps]
        label = "val loss" if tokens is None else f"val loss ({tokens:,} tokens)"
        loss_axes.plot(val_steps, val_loss, "o-" if i == 0 else "s", markersize=3 if i == 0 else 5, label=label)
    loss_axes.set_ylabel("loss")
    loss_axes.legend()
    loss_axes.set_title(os.path.basename(os.path.dirname(os.path.abspath(path))) or path)
    lr_axes.plot(steps, series("lr"), color="tab:green", linewidth=1)
    lr_axes.set_ylabel("learning rate")
    lr_axes.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    norm_axes.plot(steps, series("grad_norm"), color="tab:red", linewidth=1)
    norm_axes.set_ylabel("grad norm")
    norm_axes.set_yscale("log")  # one spike would flatten the rest
    speed_axes.plot(steps, series("tokens_per_second"), color="tab:purple", linewidth=1)
    speed_axes.set_ylabel("tokens/s")
    speed_axes.set_xlabel("step")
    for a in axes:
        a.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(output, dpi=120)
    print(f"plot_metrics: wrote {output}")


if __name__ == "__main__":
    main()
