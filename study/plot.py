"""`python -m study.plot RUN_DIR [RUN_DIR ...] [-o out.png]`: reward, held-out accuracy, entropy, grad norm and
KL-from-init of one or more runs, side by side, in one PNG.

Only measured points are drawn: a metric logged as null (`kl_from_init` on steps without a KL probe) or non-finite
(`grad_norm` of a skipped update) is left out, never drawn as 0. Per-step series are drawn raw (thin, faint) and as a
trailing moving average (thick) over the last `--smooth` measured points; the average starts at the point where a full
window exists, so a run shorter than its window has no average line (a 5-step average over 3 points would be a
3-step average that claims to be a 5-step one). The sparse KL probe series (every `--kl-every` steps) is drawn as
measured points, not averaged.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

# (metric, panel title, moving average?)
PANELS = [
    ("reward_mean", "train reward (mean over rollouts)", True),
    ("eval_acc", "held-out greedy accuracy (error bars: 2 SE)", False),
    ("entropy_mean", "token entropy (nats)", True),
    ("grad_norm", "grad norm (before clipping)", True),
    ("kl_from_init", "KL(init || policy), probe set", False),
]


def read_run(run_dir: str | Path) -> tuple[list[dict], list[dict]]:
    """(per-step records, eval records) of OUTPUT_DIR/metrics.jsonl."""
    steps, evals = [], []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            (evals if rec.get("event") == "eval" else steps).append(rec)
    return steps, evals


def measured(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records where `key` was measured: null and non-finite values are left out. A record
    without `key` is a KeyError (a renamed metric fails loudly instead of drawing an empty panel)."""
    xs, ys = [], []
    for r in records:
        v = r[key]
        if v is not None and math.isfinite(float(v)):
            xs.append(r["step"])
            ys.append(float(v))
    return xs, ys


def moving_average(xs: list[int], ys: list[float], window: int) -> tuple[list[int], list[float]]:
    """Trailing mean over the last `window` points, at the points that have a full window behind them (none when
    there are fewer than `window` points; `window` <= 1: no average)."""
    if window <= 1 or len(ys) < window:
        return [], []
    return xs[window - 1 :], [sum(ys[i - window + 1 : i + 1]) / window for i in range(window - 1, len(ys))]


def _title(run_dirs: list[str]) -> str:
    """'s_grpo on smollm2-135m, arithmetic' from the runs' config.json (the distinct values), else the run names."""
    parts = []
    for run in run_dirs:
        path = Path(run) / "config.json"
        try:
            cfg = json.loads(path.read_text())["train"]
            parts.append(f"{cfg['preset']} on {cfg['model']}, {cfg['task']}")
        except (OSError, ValueError, KeyError):
            parts.append(Path(run).name)
    return " | ".join(dict.fromkeys(parts))


def plot(run_dirs: list[str], out: str, smooth: int = 5, labels: list[str] | None = None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.8))
    run_handles = []
    for i, run in enumerate(run_dirs):
        steps, evals = read_run(run)
        label = labels[i] if labels else Path(run).name
        color = f"C{i}"
        run_handles.append(Line2D([], [], color=color, lw=2, label=label))
        for ax, (key, title, average) in zip(axes, PANELS):
            if key == "eval_acc":
                xs, ys = measured(evals, key)
                es = [2 * e.get("eval_acc_se", 0.0) for e in evals if e[key] is not None]
                ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, color=color)
            else:
                xs, ys = measured(steps, key)
                if average:
                    ax.plot(xs, ys, color=color, alpha=0.3, lw=1)
                    ax.plot(*moving_average(xs, ys, smooth), color=color, lw=2)
                else:
                    ax.plot(xs, ys, color=color, marker="o", ms=3, lw=1)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
    axes[0].legend(handles=run_handles, fontsize=8, title="run", title_fontsize=8)
    styles = [Line2D([], [], color="0.4", alpha=0.3, lw=1, label="per step (raw)")]
    if smooth > 1:
        styles.append(Line2D([], [], color="0.4", lw=2, label=f"moving average of the last {smooth} measured steps"))
    axes[2].legend(handles=styles, fontsize=8)
    fig.suptitle(_title(run_dirs), fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m study.plot",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("runs", nargs="+", help="run directories (each with metrics.jsonl)")
    parser.add_argument("-o", "--out", default=None, help="PNG path (default: FIRST_RUN/plot.png)")
    parser.add_argument(
        "--smooth",
        type=int,
        default=5,
        help="moving-average window in measured steps; drawn only where a full window exists; <= 1: none",
    )
    parser.add_argument("--labels", nargs="*", default=None, help="legend labels, one per run")
    args = parser.parse_args(argv)
    if args.labels is not None and len(args.labels) != len(args.runs):
        parser.error(f"--labels: {len(args.labels)} label(s) for {len(args.runs)} run(s)")
    out = args.out or str(Path(args.runs[0]) / "plot.png")
    print(plot(args.runs, out, args.smooth, args.labels))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
