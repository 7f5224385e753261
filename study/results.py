"""The on-disk format of a study's results folder: the runner writes it, the report and the figure read it.

    OUT/manifest.json                                  the regime, the arms, one entry per finished run
    OUT/runs/ARM/seedK/config.json, metrics.jsonl, summary.json    a finished run's files, as the trainer wrote them
    OUT/runs/ARM/seedK/heldout.jsonl                   per held-out problem: right before / after (newer runs only)
    OUT/study.csv, study.json, study.md, study.png     the report, recomputed from the runs alone

A run folder holds the same files as the trainer's --output-dir, so `is_finished` judges both: a trainer's output that
is finished can be published, a published run that is finished is skipped and reported."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

from .stability import CollapseRules, run_metrics
from .trainer import atomic_writer
from .trainer import write_json as _write_json

MANIFEST = "manifest.json"
# A run's files, in the order they are published: summary.json last, because its presence marks the run finished
RUN_FILES = ("config.json", "metrics.jsonl", "summary.json")
# Published with them when the trainer wrote it (runs made before it existed lack it, and are still reported)
OPTIONAL_RUN_FILES = ("heldout.jsonl",)
HELDOUT = "heldout.jsonl"


def is_finished(run_dir: Path) -> bool:
    """A run is finished when its folder holds a valid summary.json of a completed run (final evaluation done, not
    interrupted) next to its metrics."""
    try:
        summary = read_summary(run_dir)
    except (OSError, ValueError):
        return False
    return (
        isinstance(summary, dict)
        and "after" in summary
        and not summary.get("interrupted")
        and (run_dir / "metrics.jsonl").is_file()
    )


def finished_runs(study_dir: Path) -> list[Path]:
    """The folders of every finished run under `study_dir`/runs/ARM/seedK, sorted (an unfinished one is skipped)."""
    return sorted(p for p in (study_dir / "runs").glob("*/seed*") if p.is_dir() and is_finished(p))


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def read_records(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl: one record a line, a step's metrics or an `"event": "eval"` record."""
    with open(run_dir / "metrics.jsonl") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def load_run(run_dir: Path) -> dict:
    """A published run's metrics: {"arm", "seed", **run_metrics}, with the thresholds from its own config.json, so a
    run is judged by the rules it trained under."""
    cfg = json.loads((run_dir / "config.json").read_text())["train"]
    rules = CollapseRules(window=cfg["collapse_window"], low_entropy=cfg["collapse_entropy"])
    return {
        "arm": run_dir.parent.name,
        "seed": cfg["seed"],
        **run_metrics(read_records(run_dir), read_summary(run_dir), cfg["max_grad_norm"], rules),
    }


def copy_run_files(src: Path, dst: Path) -> None:
    """Copies a run's files from the trainer's output `src` into its results folder `dst`: the optional ones that
    exist, then RUN_FILES in order (summary.json last: its presence marks the run finished); each file atomically."""
    dst.mkdir(parents=True, exist_ok=True)
    names = [n for n in OPTIONAL_RUN_FILES if (src / n).is_file()] + list(RUN_FILES)
    for name in names:
        tmp = dst / (name + ".tmp")
        shutil.copyfile(src / name, tmp)
        os.replace(tmp, dst / name)


def read_heldout(run_dir: Path) -> dict[int, dict] | None:
    """The run's heldout.jsonl as {id: {"id", "q", "answer", "before", "after"}}, or None when the run has none (a
    run made before it was written). A line missing a field, a non-boolean outcome or a repeated id is a ValueError
    naming the file and line."""
    path = run_dir / HELDOUT
    if not path.is_file():
        return None
    out: dict[int, dict] = {}
    with open(path) as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            bad = [k for k, t in (("id", int), ("q", str), ("before", bool), ("after", bool)) if
                   not isinstance(rec.get(k), t) or (t is int and isinstance(rec.get(k), bool))]  # fmt: skip
            if bad or rec["id"] in out:
                what = f"field(s) {', '.join(bad)} missing or mistyped" if bad else f"id {rec['id']} repeated"
                raise ValueError(f"{path}, line {i}: {what}; expected {{id: int, q: str, before: bool, after: bool}}")
            out[rec["id"]] = rec
    return out


def load_heldout(run_dir: Path) -> dict[int, dict] | None:
    """`read_heldout`, checked against the run's summary.json: the accuracies before and after recomputed from the
    per-problem outcomes must equal the summary's `eval_acc` (and the counts its `eval_n`); a run whose two files
    disagree is refused (ValueError), because its per-problem tests would not be about the reported numbers."""
    heldout = read_heldout(run_dir)
    if heldout is None:
        return None
    summary = read_summary(run_dir)
    n = len(heldout)
    for phase in ("before", "after"):
        ev = summary.get(phase, {})
        acc = sum(r[phase] for r in heldout.values()) / n if n else math.nan
        want, want_n = ev.get("eval_acc"), ev.get("eval_n", n)
        if want is None or want_n != n or not math.isclose(acc, want, rel_tol=0, abs_tol=1e-9):
            raise ValueError(
                f"{run_dir}: {HELDOUT} gives held-out accuracy {phase} {acc!r} over {n} problems, summary.json "
                f"says {want!r} over {want_n}: the files disagree, refusing to report per-problem tests on them"
            )
    return heldout


def read_manifest(study_dir: Path) -> dict | None:
    """The study's manifest, {"regime", "overrides", "arms", "runs": {"ARM/seedK": what produced the run}}; None when
    the folder has none yet."""
    path = study_dir / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def write_manifest(study_dir: Path, data: dict) -> None:
    study_dir.mkdir(parents=True, exist_ok=True)
    write_json(study_dir / MANIFEST, data)


def write_json(path: Path, obj) -> None:
    """`obj` as strict JSON (a non-finite number is null), indented, written atomically: an interrupted study never
    leaves a torn file."""
    _write_json(path, obj, indent=2)


def write_file(path: Path, data: str | bytes) -> None:
    """Text or bytes to `path`, atomically: a failed write (a full disk) leaves the previous file whole."""
    with atomic_writer(path, "w" if isinstance(data, str) else "wb") as f:
        f.write(data)


def write_figure(fig, path: Path, dpi: int = 110) -> None:
    """A matplotlib figure as PNG to `path`, atomically."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    write_file(path, buf.getvalue())
