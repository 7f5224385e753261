"""The study's figure: one panel per quantity over training steps (held-out accuracy, entropy, KL from init, gradient
norm, batch success rate), one colour per arm; the line is the mean over seeds, the band the seeds' min..max."""

from __future__ import annotations

import math
from pathlib import Path

from .heldout import holm_by_pair
from .results import finished_runs, read_records, write_figure

PANELS = (
    # (title, y label, record kind, key)
    ("Held-out accuracy (greedy)", "accuracy", "eval", "eval_acc"),
    ("Policy entropy", "mean token entropy (nats)", "step", "entropy_mean"),
    ("KL from the initial policy", "k3 estimate (nats)", "step", "kl_from_init"),
    ("Gradient norm before clipping (3-step mean)", "global L2 norm", "step", "grad_norm"),
    ("Batch success rate (3-step mean)", "fraction correct", "step", "accuracy"),
)


def _series(records: list[dict], kind: str, key: str) -> dict[int, float]:
    """{step: value} of `key` over a run's records of `kind` (eval or step), the non-finite values left out."""
    out = {}
    for r in records:
        if (r.get("event") == "eval") != (kind == "eval"):
            continue
        v = r.get(key)
        if v is not None and math.isfinite(v):
            out[r["step"]] = v
    return out


def _smooth(series: dict[int, float], k: int = 3) -> dict[int, float]:
    steps = sorted(series)
    return {s: sum(series[t] for t in steps[max(0, i - k + 1) : i + 1]) / len(steps[max(0, i - k + 1) : i + 1])
            for i, s in enumerate(steps)}  # fmt: skip


def plot_study(study_dir: Path, arms: list[str], regime: str, path: Path) -> None:
    import matplotlib  # only a report with its figure needs matplotlib: --no-figure runs without it

    matplotlib.use("Agg")  # draws to a file, no display needed; set before pyplot is imported
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(2, 3, figsize=(14, 7.6), constrained_layout=True)
    axes, legend_ax = list(grid.flat[: len(PANELS)]), grid.flat[len(PANELS)]
    colours = plt.get_cmap("tab10")
    n_seeds = {}
    finished = finished_runs(study_dir)
    for i, arm in enumerate(arms):
        runs = [read_records(p) for p in finished if p.parent.name == arm]
        n_seeds[arm] = len(runs)
        for ax, (_, _, kind, key) in zip(axes, PANELS):
            per_run = [_series(r, kind, key) for r in runs]
            if key in ("accuracy", "grad_norm"):
                per_run = [_smooth(s) for s in per_run]
            steps = sorted(set().union(*per_run)) if per_run else []
            steps = [s for s in steps if all(s in p for p in per_run)]  # points every seed measured
            if not steps:
                continue
            vals = [[p[s] for p in per_run] for s in steps]
            mean = [sum(v) / len(v) for v in vals]
            c = colours(i % 10)  # past 10 arms the colours repeat, dashed: no two arms look alike
            ax.plot(steps, mean, color=c, lw=1.6, ls="-" if i < 10 else "--", marker="o" if kind == "eval" else None,
                    ms=3, label=arm)  # fmt: skip
            if len(per_run) > 1:
                ax.fill_between(steps, [min(v) for v in vals], [max(v) for v in vals], color=c, alpha=0.15, lw=0)
    for ax, (title, ylabel, _, _key) in zip(axes, PANELS):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    seeds = sorted(set(n_seeds.values()))
    handles, labels = axes[1].get_legend_handles_labels()
    legend_ax.axis("off")
    legend_ax.legend(handles, [f"{a} ({n_seeds[a]} seeds)" for a in labels], loc="center", fontsize=10,
                     title="arm", frameon=False)  # fmt: skip
    fig.suptitle(
        f"Study regime '{regime}': mean over {'/'.join(map(str, seeds))} seeds per arm (band: min..max over seeds)",
        fontsize=11,
    )
    write_figure(fig, path)
    plt.close(fig)


def forest_labels(rows: list[tuple[str, dict, tuple[str, str]]], holm: dict[frozenset, float]) -> list[str]:
    """A forest row's label: its name, its number of seeds, and a star when its pair's Holm-adjusted p (`holm`:
    {frozenset((arm, baseline)): p}) is below 0.05."""
    return [f"{label} ({r['after']['n']})" + (" *" if holm.get(frozenset(pair), 1.0) < 0.05 else "")
            for label, r, pair in rows]  # fmt: skip


def plot_forest(tests: dict[str, dict[str, dict]], regime: str, path: Path, contrasts: list[dict] = (),
                multiplicity: list[dict] = ()) -> None:  # fmt: skip
    """The paired differences of held-out accuracy after training, one panel per baseline (`tests`: {baseline: {arm:
    stats.compare(...)}}) and one for the contrasts between methods (heldout.CONTRASTS) when there are any: per row the
    mean difference over seeds with its t-based 95% interval (line) and the bootstrap interval (thick bar), a line at
    0; an interval crossing it is within noise. With a `multiplicity` family (heldout.heldout_multiplicity) of two
    pairs or more, a row whose Holm-adjusted p is below 0.05 is marked with a star, and the title counts them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    holm = holm_by_pair(multiplicity) if len(multiplicity) > 1 else {}
    panels = [(f"against {b}", f"held-out accuracy after training: arm - {b}", [(a, r, (a, b)) for a, r in t.items()])
              for b, t in tests.items() if t]  # fmt: skip
    if contrasts:
        rows = [(f"{r['arm']} - {r['baseline']}", r, (r["arm"], r["baseline"])) for r in contrasts]
        panels.append(("contrasts between methods", "held-out accuracy after training: arm - baseline", rows))
    rows = max(len(p[2]) for p in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 1.2 + 0.42 * rows), constrained_layout=True,
                             squeeze=False)  # fmt: skip
    for ax, (title, xlabel, table) in zip(axes.flat, panels):
        table = table[::-1]  # the first row at the top
        for y, (_, r, _) in enumerate(table):
            t, boot = r["after"], r["bootstrap_ci"]
            beyond = "within" not in r["reading"] and t["n"] > 1
            colour = "tab:red" if beyond else "tab:blue"
            if all(math.isfinite(v) for v in boot):
                ax.plot(boot, [y, y], color=colour, lw=5, alpha=0.3, solid_capstyle="butt")
            if all(math.isfinite(v) for v in t["ci"]):
                ax.errorbar(t["mean"], y, xerr=[[t["mean"] - t["ci"][0]], [t["ci"][1] - t["mean"]]], fmt="none",
                            ecolor=colour, elinewidth=1.2, capsize=3)  # fmt: skip
            ax.plot([t["mean"]], [y], "o", color=colour, ms=5)
        ax.axvline(0.0, color="black", lw=0.8)
        ax.set_yticks(range(len(table)), forest_labels(table, holm))
        ax.set_ylim(-0.7, len(table) - 0.3)
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    suptitle = (
        f"Study '{regime}': paired difference per seed, mean with t 95% CI (line) and bootstrap 95% CI (bar); "
        "(seeds); red: beyond noise"
    )
    if holm:
        kept = sum(p < 0.05 for p in holm.values())
        suptitle += f" test by test; *: still beyond noise after Holm's correction over {len(holm)} pairs ({kept})"
    fig.suptitle(suptitle, fontsize=10)
    write_figure(fig, path)
    plt.close(fig)
