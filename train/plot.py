"""`python -m train.plot RUN_DIR [RUN_DIR ...] [-o out.png]`: reward, held-out accuracy, entropy, grad norm and
KL-from-init of one or more runs, side by side, in one PNG."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

PANELS = [
    ("reward_mean", "train reward (mean over rollouts)"),
    ("eval_acc", "held-out greedy accuracy"),
    ("entropy_mean", "token entropy (nats)"),
    ("grad_norm", "grad norm (before clipping)"),
    ("kl_from_init", "KL(init || policy), probe set"),
]


def read_run(run_dir: str | Path) -> tuple[list[dict], list[dict]]:
    """(per-step records, eval records) of OUTPUT_DIR/metrics.jsonl."""
    steps, evals = [], []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            (evals if rec.get("event") == "eval" else steps).append(rec)
    return steps, evals


def _smooth(values: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(values)):
        chunk = [v for v in values[max(0, i - window + 1) : i + 1] if math.isfinite(v)]
        out.append(sum(chunk) / len(chunk) if chunk else float("nan"))
    return out


def plot(run_dirs: list[str], out: str, smooth: int = 5, labels: list[str] | None = None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.4))
    for i, run in enumerate(run_dirs):
        steps, evals = read_run(run)
        label = labels[i] if labels else Path(run).name
        color = f"C{i}"
        for ax, (key, title) in zip(axes, PANELS):
            if key == "eval_acc":
                xs = [e["step"] for e in evals]
                ys = [e["eval_acc"] for e in evals]
                es = [2 * e.get("eval_acc_se", 0.0) for e in evals]
                ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, color=color, label=label)
            else:
                xs = [r["step"] for r in steps]
                ys = [float(r[key]) for r in steps]  # a renamed metric is a KeyError, not an empty panel
                ax.plot(xs, ys, color=color, alpha=0.25)
                ax.plot(xs, _smooth(ys, smooth), color=color, label=label)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, title="error bars: 2 SE", title_fontsize=8)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.plot", description=__doc__)
    parser.add_argument("runs", nargs="+", help="run directories (each with metrics.jsonl)")
    parser.add_argument("-o", "--out", default=None, help="PNG path (default: FIRST_RUN/plot.png)")
    parser.add_argument("--smooth", type=int, default=5, help="moving-average window over steps")
    parser.add_argument("--labels", nargs="*", default=None, help="legend labels, one per run")
    args = parser.parse_args(argv)
    out = args.out or str(Path(args.runs[0]) / "plot.png")
    print(plot(args.runs, out, args.smooth, args.labels))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
