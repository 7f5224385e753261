"""The study's stability curves (study_curves.png): per arm, the mean over seeds of a step quantity with a band of +-1
standard error over seeds (policy entropy, KL from init, gradient norm, reward, and the mechanism logs update_norm /
ld_correct_shared when the runs have them). Written only for studies whose runs have heldout.jsonl (the decisive
study's format); older studies keep their single figure (figure.py)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from .results import finished_runs, read_records, write_figure

CURVES = (
    # (key, title, y label, interpolate between the steps where it is logged)
    ("entropy_mean", "Policy entropy", "mean token entropy (nats)", False),
    ("kl_from_init", "KL from the initial policy (interpolated between probes)", "k3 estimate (nats)", True),
    ("grad_norm", "Gradient norm before clipping", "global L2 norm", False),
    ("reward_mean", "Batch reward", "mean reward", False),
    ("update_norm", "Update norm (per step)", "L2 norm of the parameter update", False),
    ("ld_correct_shared", "Log-prob change, correct completions' shared tokens", "nats", False),
)
OPTIONAL = ("update_norm", "ld_correct_shared")  # --log-mechanism only: a panel only when some run logged it


def step_series(records: list[dict], key: str, interpolate: bool = False) -> dict[int, float]:
    """{step: value} of `key` over the step records (eval events left out, null / non-finite values left out). With
    `interpolate`, the steps between two logged ones get the linear interpolation (none before the first logged step
    or after the last: nothing is extrapolated)."""
    steps = sorted(r["step"] for r in records if "event" not in r)
    known = {}
    for r in records:
        v = r.get(key)
        if "event" not in r and v is not None and math.isfinite(v):
            known[r["step"]] = float(v)
    if not interpolate or len(known) < 2:
        return known
    out, points = {}, sorted(known.items())
    j = 0
    for s in steps:
        if s < points[0][0] or s > points[-1][0]:
            continue
        while points[j + 1][0] < s:
            j += 1
        (s0, v0), (s1, v1) = points[j], points[j + 1]
        out[s] = v0 + (v1 - v0) * (s - s0) / (s1 - s0) if s != s0 else v0
    return out


def band(per_run: list[dict[int, float]]) -> dict:
    """Mean over runs and mean +- SE (sample SD / sqrt(n)) at the steps every run has; no band for one run."""
    steps = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
    mean, lo, hi = [], [], []
    for s in steps:
        v = [p[s] for p in per_run]
        m = sum(v) / len(v)
        se = statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else 0.0
        mean.append(m)
        lo.append(m - se)
        hi.append(m + se)
    return {"steps": steps, "mean": mean, "lo": lo, "hi": hi, "n": len(per_run)}


def curve_data(study_dir: Path, arms: list[str]) -> dict[str, dict[str, dict]]:
    """{key: {arm: band}} for every curve; an optional (mechanism) key only when some run logged it."""
    finished = finished_runs(study_dir)
    records = {arm: [read_records(p) for p in finished if p.parent.name == arm] for arm in arms}
    out = {}
    for key, _, _, interp in CURVES:
        per_arm = {arm: band([step_series(r, key, interp) for r in runs]) for arm, runs in records.items()}
        if key in OPTIONAL and not any(b["steps"] for b in per_arm.values()):
            continue
        out[key] = per_arm
    return out


def plot_curves(study_dir: Path, arms: list[str], regime: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = curve_data(study_dir, arms)
    panels = [c for c in CURVES if c[0] in data]
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, grid = plt.subplots(rows, cols, figsize=(14, 3.6 * rows + 0.8), constrained_layout=True, squeeze=False)
    colours = plt.get_cmap("tab10")
    for ax, (key, title, ylabel, _) in zip(grid.flat, panels):
        for i, arm in enumerate(arms):
            b = data[key][arm]
            if not b["steps"]:
                continue
            c = colours(i % 10)
            ax.plot(b["steps"], b["mean"], color=c, lw=1.5, ls="-" if i < 10 else "--", label=f"{arm} ({b['n']})")
            if b["n"] > 1:
                ax.fill_between(b["steps"], b["lo"], b["hi"], color=c, alpha=0.15, lw=0)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    for ax in list(grid.flat)[len(panels) :]:
        ax.axis("off")
    handles, labels = grid.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(6, max(1, len(labels))), fontsize=9,
               title="arm (seeds)", frameon=False)  # fmt: skip
    fig.suptitle(f"Study '{regime}': stability over training, mean over seeds per arm (band: +-1 SE over seeds)",
                 fontsize=11)  # fmt: skip
    write_figure(fig, path)
    plt.close(fig)
