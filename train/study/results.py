"""The on-disk format of a study's results folder: the runner writes it, the report and the figure read it.

    OUT/manifest.json                                  the regime, the arms, one entry per finished run
    OUT/runs/ARM/seedK/config.json, metrics.jsonl, summary.json    a finished run's files, as the trainer wrote them
    OUT/study.csv, study.json, study.md, study.png     the report, recomputed from the runs alone

A run folder holds the same files as the trainer's --output-dir, so `is_finished` judges both: a trainer's output that
is finished can be published, a published run that is finished is skipped and reported."""

from __future__ import annotations

import json
from pathlib import Path

from ..run.metrics import write_json as _write_json
from ..stability import CollapseRules, run_metrics

MANIFEST = "manifest.json"
# A run's files, in the order they are published: summary.json last, because its presence marks the run finished
RUN_FILES = ("config.json", "metrics.jsonl", "summary.json")


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
