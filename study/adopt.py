"""python -m study.adopt: copy a published study's finished runs into another study under another arm name, after
checking that they are what that arm would run there (the same trainer configuration, field by field, but for where
and how the run was launched). A pre-registered study pairs new arms with published runs by seed this way
(docs/study-v2-preregistration.md): e.g. the decisive study's `grpo_nokl_tr` runs, made with `--set lr=1.5e-4`, are
the v2 study's `grpo_nokl_tr_lr1.5e-4` (an arm that sets its lr itself). The files are copied unchanged (git stores
the same blobs once); the manifest entry is the source's, plus `adopted_from`.

A trainer field that is absent from a run's config.json (added to the trainer after the run was made) counts as equal
when the arm leaves it at its default, and is named in the entry's `absent_at_source`. Whether that default computes
what the older trainer computed is not shown by this check: that is what the tiny-model fingerprint and the
reproduction gate are for (docs/study-v2-addendum-2026-11-29c.md)."""

from __future__ import annotations

import argparse
import dataclasses
import filecmp
import json
import sys
from pathlib import Path

from .grid import ARMS, REGIMES, RESEARCH_ARMS, RunSpec, parse_seeds, parse_sets
from .results import (
    OPTIONAL_RUN_FILES,
    RUN_FILES,
    copy_run_files,
    is_finished,
    read_config,
    read_manifest,
    write_manifest,
)
from .trainer import dumps

# How and where a run was launched, not what it computed: not compared
LAUNCH_FIELDS = ("output_dir", "threads", "progress", "resume", "overwrite", "report_to")


def compare_config(run_dir: Path, spec: RunSpec, present_only: bool = False) -> tuple[list[str], list[str]]:
    """(the trainer fields whose value in the run's config.json differs from what `spec` would run, as "field: run's
    value != spec's value"; the fields the run lacks and `spec` leaves at their default, `absent_at_source`).
    LAUNCH_FIELDS and the absent-at-default fields are not differences; with `present_only`, no field the run lacks
    is (a report's check of written runs)."""
    config = spec.config()
    want, defaults = (json.loads(dumps(dataclasses.asdict(c))) for c in (config, type(config)()))
    have = read_config(run_dir)
    absent = sorted(k for k in set(want) - set(have) if present_only or want[k] == defaults.get(k))
    keys = sorted((set(have) | set(want)) - set(LAUNCH_FIELDS) - set(absent))
    diffs = [
        f"{k}: {have.get(k, '(absent)')!r} != {want.get(k, '(absent)')!r}" for k in keys if have.get(k) != want.get(k)
    ]
    return diffs, absent


def _same_run(a: Path, b: Path) -> bool:
    """Whether the two run folders hold the same run files, byte for byte."""
    names = [n for n in (*OPTIONAL_RUN_FILES, *RUN_FILES) if (a / n).is_file() or (b / n).is_file()]
    return all((a / n).is_file() and (b / n).is_file() and filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def differences(folder: Path, spec: RunSpec, present_only: bool = False) -> str:
    """compare_config's differences as one text (the first three, and how many more), or ""."""
    diff, _ = compare_config(folder, spec, present_only)
    return "; ".join(diff[:3]) + (f" (and {len(diff) - 3} more)" if len(diff) > 3 else "")


def adopt(src: Path, src_arm: str, dst: Path, dst_arm: str, seeds: list[int], overrides: dict[str, str]) -> list[str]:
    """Copies runs src/runs/SRC_ARM/seedK to dst/runs/DST_ARM/seedK for each seed and records them in dst's manifest
    (created with `overrides` when missing; an existing one must have the same overrides). Every run is checked before
    any is copied; a run that is unfinished, or whose configuration differs from what DST_ARM runs under `overrides`,
    is a ValueError naming it. Returns the keys adopted."""
    arm = {**ARMS, **RESEARCH_ARMS}.get(dst_arm)
    if arm is None:
        raise ValueError(f"--as {dst_arm!r}: not an arm of study/grid.py")
    manifest = read_manifest(dst) or {"regime": dst.name, "overrides": overrides, "arms": {}, "runs": {}}
    if manifest.get("overrides") != overrides:
        raise ValueError(f"{dst}: its overrides are {manifest.get('overrides')}, these are {overrides}")
    source = (read_manifest(src) or {}).get("runs", {})
    checked = []  # (seed, run, spec, absent_at_source) of every run, all checked before any is copied
    for seed in seeds:
        run = src / "runs" / src_arm / f"seed{seed}"
        if not is_finished(run):
            raise ValueError(f"{run}: not a finished run")
        spec = RunSpec(arm, seed, dict(overrides), Path("work"), dst / "runs" / dst_arm / f"seed{seed}")
        diff, absent = compare_config(run, spec)
        if diff:
            raise ValueError(f"{run} is not what {dst_arm} runs under {overrides}: " + "; ".join(diff))
        if is_finished(spec.result_dir) and not _same_run(run, spec.result_dir):
            raise ValueError(f"{spec.result_dir} holds another finished run already (not {run}'s files); move it "
                             "away first, or adopt into another study")  # fmt: skip
        checked.append((seed, run, spec, absent))
    keys = []
    for seed, run, spec, absent in checked:
        key = f"{dst_arm}/seed{seed}"
        entry = {**source.get(f"{src_arm}/seed{seed}", {}), "arm": dst_arm}
        entry["adopted_from"] = f"{src.name}/{src_arm}/seed{seed}"
        if absent:
            entry["absent_at_source"] = absent
        copy_run_files(run, spec.result_dir)
        manifest["runs"][key] = entry
        keys.append(key)
    manifest["arms"][dst_arm] = arm.as_dict()
    write_manifest(dst, manifest)
    return keys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m study.adopt", description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="src", type=Path, required=True, help="the published study's results folder")
    p.add_argument("--arm", required=True, help="the arm's name there")
    p.add_argument("--to", dest="dst", type=Path, required=True, help="the study's results folder to copy into")
    p.add_argument("--as", dest="dst_arm", required=True, help="the arm's name in that study (study/grid.py)")
    p.add_argument("--seeds", required=True, type=parse_seeds, help="comma-separated seeds, e.g. 0,1,2")
    p.add_argument("--regime", default="decisive", choices=sorted(REGIMES), help="the destination's regime")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="its extra trainer overrides")
    args = p.parse_args(argv)
    try:
        overrides = {**REGIMES[args.regime], **parse_sets(args.set)}
        keys = adopt(args.src, args.arm, args.dst, args.dst_arm, args.seeds, overrides)
    except ValueError as exc:
        print(f"python -m study.adopt: {exc}", file=sys.stderr)
        return 2
    print(f"adopted {len(keys)} run(s) into {args.dst}: {', '.join(keys)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
