"""What a pre-registered study's runs must be before its plan reads them (docs/study-v2-preregistration.md: §1 fixes
the task and schedule, §6 the seeds). The plan's rules pair runs by seed number and read each run's summary, steps and
held-out outcomes; these checks make sure that what they read is what the plan means:

- each run is what the study runs: every setting in its config.json equals what the regime (the manifest's
  overrides) and its arm run, as the runner and study.adopt compare them;
- it trained every step of its schedule: step records 1 .. max_steps, each once (a cut metrics.jsonl would move the
  "last 10 steps" of the collapse endpoint);
- its summary has the held-out accuracy before and after, and its heldout.jsonl gives the same numbers
  (`results.load_heldout`);
- the runs of one seed were evaluated on the same held-out problems (ids and questions), so that pairing by seed pairs
  like with like (a copied run under another seed's folder draws another set).

(Every study's report also checks each step's fields that the collapse rules read: results.load_run.)

A run that fails is a ValueError naming its folder and what is wrong. Runs of seeds the plan does not have for their
arm (§6: none is added) are left out of every test and table and named in the report (decide.in_plan)."""

from __future__ import annotations

import math
from pathlib import Path

from .adopt import differences
from .grid import ARMS, RESEARCH_ARMS, RunSpec
from .results import load_heldout, read_config, read_records, read_summary
from .stats import _pair_problems


def check_plan_runs(manifest: dict, dirs: list[Path], runs: list[dict]) -> None:
    """ValueError naming the first run of a pre-registered study that is not what its plan reads (module docstring).
    `manifest`: the study's manifest.json; `dirs` / `runs`: its finished runs (results.finished_runs / load_run)."""
    overrides = {k: str(v) for k, v in (manifest.get("overrides") or {}).items()}
    known = {**ARMS, **RESEARCH_ARMS}
    first_of_seed: dict[int, tuple[Path, dict]] = {}
    for path, run in zip(dirs, runs):
        arm = known.get(run["arm"])
        if arm is not None:
            _check_regime(path, RunSpec(arm, run["seed"], overrides, Path("w"), path))
        _check_steps(path, read_config(path).get("max_steps"))
        held = _check_outcomes(path)
        base = first_of_seed.setdefault(run["seed"], (path, held))
        if base[0] is not path:
            _pair_problems(held, base[1], f"{path} and {base[0]} (seed {run['seed']}, paired by the plan)")


def _check_regime(path: Path, spec: RunSpec) -> None:
    """Each setting in the run's config.json equals what `spec` runs (LAUNCH_FIELDS aside); a setting the run's trainer
    did not write yet is not compared (study.adopt checks those at adoption)."""
    if diff := differences(path, spec, present_only=True):
        raise ValueError(f"{path}: not a run of this study's regime and arm ({spec.arm.name}): {diff} (the run's != "
                         "the study's)")  # fmt: skip


def _check_steps(path: Path, max_steps) -> None:
    if not isinstance(max_steps, int) or isinstance(max_steps, bool):
        raise ValueError(
            f'{path / "config.json"}: "train"."max_steps" is {max_steps!r}; expected the run\'s step count'
        )
    steps = [r for r in read_records(path) if "event" not in r]
    numbers = sorted(r.get("step") for r in steps if isinstance(r.get("step"), int))
    if len(numbers) != len(steps) or numbers != list(range(1, max_steps + 1)):
        have = f"{len(numbers)} step records" + (f", steps {numbers[0]} to {numbers[-1]}" if numbers else "")
        raise ValueError(f"{path / 'metrics.jsonl'}: {have}; its config.json trains steps 1 to {max_steps}, each "
                         "recorded once (a cut or joined metrics.jsonl would move the collapse endpoint)")  # fmt: skip


def _check_outcomes(path: Path) -> dict:
    summary = read_summary(path)
    missing = [p for p in ("before", "after") if not _finite(summary.get(p, {}).get("eval_acc"))]
    if missing:
        raise ValueError(f"{path / 'summary.json'}: no held-out accuracy {' or '.join(missing)} training; the plan's "
                         "collapse endpoint compares the two")  # fmt: skip
    held = load_heldout(path)  # (its outcomes must give the summary's numbers)
    if held is None:
        raise ValueError(f"{path}: no heldout.jsonl; the plan pairs runs by seed on the same held-out problems")
    return held


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _finite(x) -> bool:
    return _number(x) and math.isfinite(x)
