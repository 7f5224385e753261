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
import re
import shutil
from functools import cache
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
# The name of a run's folder: seed and the seed's integer, as the runner writes it (seed0, seed12; not seed01,
# seed0.bak); any other folder under runs/ARM/ is not a run of the study (stray_folders names them)
SEED_DIR = re.compile(r"seed(0|[1-9][0-9]*)")
# What a run's config.json must hold for the report (the rest of its "train" section is the trainer's business)
CONFIG_EXPECTED = ('the trainer\'s config.json, {"train": {"seed": int, "max_grad_norm": number, '
                   '"collapse_window": int, "collapse_entropy": number, ...}, ...}')  # fmt: skip
SUMMARY_EXPECTED = ('the trainer\'s summary.json, {"before": {"eval_acc": number, ...}, '
                    '"after": {"eval_acc": number, ...}}')  # fmt: skip
MANIFEST_EXPECTED = ('a study\'s manifest, {"regime": str, "overrides": {...}, "arms": {...}, '
                     '"runs": {"ARM/seedK": {...}}}')  # fmt: skip


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _kind(x) -> str:
    """The JSON name of a value's type, for messages ("a list", "null")."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(x), "a number")


def read_json(path: Path, expected: str):
    """The JSON in `path`; a file that cannot be read (missing, a folder) or is not JSON is a ValueError naming it and
    `expected` (what the file should hold), never a bare decoder message."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror or exc}); expected {expected}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text; expected {expected}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno}); expected "
                         f"{expected}") from None  # fmt: skip


def read_jsonl(path: Path, expected: str) -> list[dict]:
    """The JSON objects of a JSON-lines file (blank lines skipped); a line that is not a JSON object is a ValueError
    naming the file and the line."""
    return [rec for _, rec in numbered_jsonl(path, expected)]


def numbered_jsonl(path: Path, expected: str) -> list[tuple[int, dict]]:
    """`read_jsonl` with each object's line number."""
    try:
        with open(path) as fh:
            lines = list(fh)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror or exc}); expected {expected}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text; expected {expected}") from None
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}, line {i}: not valid JSON ({exc.msg}); expected {expected}") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{path}, line {i}: {_kind(rec)}, not a JSON object; expected {expected}")
        out.append((i, rec))
    return out


def is_finished(run_dir: Path) -> bool:
    """A run is finished when its folder holds a valid summary.json of a completed run (final evaluation done, not
    interrupted, not stopped by --time-budget-s before its last step) next to its metrics."""
    try:
        summary = read_summary(run_dir)
    except (OSError, ValueError):
        return False
    return (
        isinstance(summary, dict)
        and "after" in summary
        and not summary.get("interrupted")
        and not summary.get("stopped_by_time_budget")  # (fewer steps than its config's: a later call continues it)
        and (run_dir / "metrics.jsonl").is_file()
    )


def finished_runs(study_dir: Path, check: bool = True) -> list[Path]:
    """The folders of every finished run under `study_dir`/runs/ARM/seedK, sorted (an unfinished one is skipped; a
    folder not named seedK is no run: stray_folders). With `check`, the runs are checked as the report needs them
    (check_runs): a ValueError names a run whose config.json is not that of its folder's seed and arm, or two folders
    holding the same run."""
    dirs = sorted(p for p in (study_dir / "runs").glob("*/seed*")
                  if SEED_DIR.fullmatch(p.name) and p.is_dir() and is_finished(p))  # fmt: skip
    if check:
        check_runs(dirs)
    return dirs


def stray_folders(study_dir: Path) -> list[Path]:
    """The folders under `study_dir`/runs/ARM/ that are not seedK folders (a copy seed0.bak, seed01): not reported."""
    return sorted(p for p in (study_dir / "runs").glob("*/*") if p.is_dir() and not SEED_DIR.fullmatch(p.name))


def check_runs(dirs: list[Path]) -> None:
    """ValueError unless each run is what its folder says: the seed in its config.json is the folder's (seedK), no two
    folders of an arm hold the same seed, and a run in the folder of an arm of study/grid.py has that arm's preset, loss
    and trainer flags (arm_mismatch)."""
    configs = {p: read_config(p) for p in dirs}
    same: dict[tuple[str, int], list[Path]] = {}
    for p, cfg in configs.items():
        same.setdefault((p.parent.name, cfg["seed"]), []).append(p)
    for (arm, seed), paths in same.items():
        if len(paths) > 1:
            raise ValueError(f"{' and '.join(map(str, paths))}: each config.json says seed {seed} of arm {arm}: the "
                             "same run twice; keep one")  # fmt: skip
    for p, cfg in configs.items():
        if cfg["seed"] != int(p.name.removeprefix("seed")):
            raise ValueError(f"{p}: its config.json says seed {cfg['seed']}, its folder {p.name}; a run's folder "
                             f"must be seed<its seed> (runs/ARM/seed{cfg['seed']})")  # fmt: skip
        if problem := arm_mismatch(p.parent.name, cfg):
            raise ValueError(f"{p}: not a run of arm {p.parent.name!r} (study/grid.py): {problem}")


@cache
def _arm_config(name: str) -> dict | None:
    """The trainer configuration of arm `name` (any seed, no regime) as config.json writes it; None for an arm that
    study/grid.py does not define."""
    import dataclasses

    from .grid import ARMS, RESEARCH_ARMS, RunSpec
    from .trainer import dumps

    arm = {**ARMS, **RESEARCH_ARMS}.get(name)
    if arm is None:
        return None
    return json.loads(dumps(dataclasses.asdict(RunSpec(arm, 0, {}, Path("w"), Path("r")).config())))


def arm_mismatch(name: str, cfg: dict) -> str | None:
    """The first setting of the arm's own (preset, loss, its trainer flags) in which a run's config.json "train"
    section `cfg` differs from arm `name`, as "field: run's != arm's"; None when none does, or when `name` is not an arm
    of study/grid.py. A field absent from `cfg` (an older trainer's) is not compared."""
    want = _arm_config(name)
    if want is None:
        return None
    from .grid import ARMS, RESEARCH_ARMS

    fields = ("preset", "loss", *{**ARMS, **RESEARCH_ARMS}[name].train)
    for k in (k for k in fields if k in cfg):
        have, arm = (cfg[k] or "", want[k] or "") if k == "loss" else (cfg[k], want[k])  # no --loss: null, as ""
        if have != arm:
            return f"{k}: {have!r} != {arm!r} (the arm's)"
    return None


def read_config(run_dir: Path) -> dict:
    """The "train" section of the run's config.json, with the keys the report reads checked; else a ValueError naming
    the file and what it should hold."""
    path = run_dir / "config.json"
    data = read_json(path, CONFIG_EXPECTED)
    train = data.get("train") if isinstance(data, dict) else None
    if not isinstance(train, dict):
        what = 'no "train" object' if isinstance(data, dict) else f"{_kind(data)}, not a JSON object"
        raise ValueError(f"{path}: {what}; expected {CONFIG_EXPECTED}")
    want = (("seed", int), ("max_grad_norm", float), ("collapse_window", int), ("collapse_entropy", float))
    bad = [k for k, t in want if not _number(train.get(k)) or (t is int and not isinstance(train[k], int))]
    if bad:
        raise ValueError(f'{path}: "train" has {", ".join(bad)} missing or mistyped; expected {CONFIG_EXPECTED}')
    return train


def read_summary(run_dir: Path) -> dict:
    """The run's summary.json (a ValueError naming it when it is not JSON); is_finished and check_summary judge it."""
    return read_json(run_dir / "summary.json", SUMMARY_EXPECTED)


def check_summary(run_dir: Path, summary) -> None:
    """ValueError naming the run's summary.json unless it is an object whose "before" / "after" (when present) are
    objects with an "eval_acc" (when present) that is a number in [0, 1]."""
    bad = "" if isinstance(summary, dict) else f"{_kind(summary)}, not a JSON object"
    for phase in ("before", "after"):
        ev = summary.get(phase, {}) if not bad else {}
        if not isinstance(ev, dict):
            bad = bad or f'"{phase}" is {_kind(ev)}'
        elif "eval_acc" in ev and not _number(ev["eval_acc"]):
            bad = bad or f'"{phase}"."eval_acc" is {_kind(ev["eval_acc"])}'
        elif "eval_acc" in ev and not 0 <= ev["eval_acc"] <= 1:  # NaN included: an accuracy is a fraction
            bad = bad or f'"{phase}"."eval_acc" is {ev["eval_acc"]!r}, not an accuracy in [0, 1]'
    if bad:
        raise ValueError(f"{run_dir / 'summary.json'}: {bad}; expected {SUMMARY_EXPECTED}")


def read_records(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl: one record a line, a step's metrics or an `"event": "eval"` record."""
    return read_jsonl(run_dir / "metrics.jsonl", "the trainer's metrics.jsonl, one JSON object a line")


RULE_FIELDS = ("accuracy", "format_frac", "zero_var_frac")  # finite in every step record the trainer writes


def check_steps(run_dir: Path, records: list[dict]) -> None:
    """ValueError naming the step unless the fields the collapse rules read are numbers: accuracy, format and
    zero-variance fractions finite (where a record has them), the entropy a number, or NaN / null (strict JSON) only
    where the step's loss is too (a step that computed no loss writes both so)."""
    for r in (r for r in records if "event" not in r):
        bad = [k for k in RULE_FIELDS if k in r and not (_number(r[k]) and math.isfinite(r[k]))]
        h = r.get("entropy_mean")
        bad += ["entropy_mean"] if h is not None and not _number(h) else []
        if bad:
            raise ValueError(f"{run_dir / 'metrics.jsonl'}: step {r.get('step')}: {', '.join(bad)} is "
                             f"{r.get(bad[0])!r}; the collapse rules need numbers there")  # fmt: skip
        loss = r.get("loss")
        if "entropy_mean" in r and not (_number(h) and math.isfinite(h)) and _number(loss) and math.isfinite(loss):
            raise ValueError(f"{run_dir / 'metrics.jsonl'}: step {r.get('step')}: entropy_mean is {h!r} but its loss "
                             f"{loss!r} was computed (the trainer writes no entropy only with no loss)")  # fmt: skip


def load_run(run_dir: Path) -> dict:
    """A published run's metrics: {"arm", "seed", **run_metrics}, with the thresholds from its own config.json, so a
    run is judged by the rules it trained under. A file that lacks what they need is a ValueError naming it."""
    cfg = read_config(run_dir)
    rules = CollapseRules(window=cfg["collapse_window"], low_entropy=cfg["collapse_entropy"])
    summary = read_summary(run_dir)
    check_summary(run_dir, summary)
    records = read_records(run_dir)
    check_steps(run_dir, records)
    try:
        metrics = run_metrics(records, summary, cfg["max_grad_norm"], rules)
    except (KeyError, TypeError, ValueError) as exc:
        what = f"a step record lacks {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise ValueError(f"{run_dir / 'metrics.jsonl'}: the run's metrics cannot be computed from it ({what}); "
                         "expected the trainer's step records") from None  # fmt: skip
    return {"arm": run_dir.parent.name, "seed": cfg["seed"], **metrics}


def copy_run_files(src: Path, dst: Path) -> None:
    """Copies a run's files from the trainer's output `src` into its results folder `dst`: the optional ones that
    exist, then RUN_FILES in order (summary.json last: its presence marks the run finished); each file atomically."""
    dst.mkdir(parents=True, exist_ok=True)
    names = [n for n in OPTIONAL_RUN_FILES if (src / n).is_file()] + list(RUN_FILES)
    for name in names:
        tmp = dst / (name + ".tmp")
        try:
            shutil.copyfile(src / name, tmp)
            os.replace(tmp, dst / name)
        except BaseException:  # (a full disk) no .tmp left behind; the run stays unpublished until a later call
            tmp.unlink(missing_ok=True)
            raise


def read_heldout(run_dir: Path) -> dict[int, dict] | None:
    """The run's heldout.jsonl as {id: {"id", "q", "answer", "before", "after"}}, or None when the run has none (a
    run made before it was written). A line missing a field, a non-boolean outcome or a repeated id is a ValueError
    naming the file and line."""
    path = run_dir / HELDOUT
    if not path.is_file():
        return None
    out: dict[int, dict] = {}
    expected = "{id: int, q: str, before: bool, after: bool}"
    for i, rec in numbered_jsonl(path, expected):
        bad = [k for k, t in (("id", int), ("q", str), ("before", bool), ("after", bool)) if
               not isinstance(rec.get(k), t) or (t is int and isinstance(rec.get(k), bool))]  # fmt: skip
        if bad or rec["id"] in out:
            what = f"field(s) {', '.join(bad)} missing or mistyped" if bad else f"id {rec['id']} repeated"
            raise ValueError(f"{path}, line {i}: {what}; expected {expected}")
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
    if not path.exists() and not path.is_symlink():
        return None
    data = read_json(path, MANIFEST_EXPECTED)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: {_kind(data)}, not a JSON object; expected {MANIFEST_EXPECTED}")
    want = (("regime", str), ("overrides", dict), ("arms", dict), ("runs", dict))
    bad = [f'"{k}" is {_kind(data[k])}' for k, t in want if k in data and not isinstance(data[k], t)]
    runs = data.get("runs") if isinstance(data.get("runs"), dict) else {}
    bad += [f'"runs"."{k}" is {_kind(e)}' for k, e in runs.items() if not isinstance(e, dict)]
    bad += [f'"runs"."{k}"."wall_s" is {_kind(e["wall_s"])}' for k, e in runs.items()
            if isinstance(e, dict) and "wall_s" in e and not _number(e["wall_s"])]  # fmt: skip
    if bad:
        raise ValueError(f"{path}: {bad[0]}; expected {MANIFEST_EXPECTED}")
    return data


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
