"""Compare the runs of benchmarks/ab_decisive_step.sh: every record equal but its timings (and the keys added since the
old commit), and the paired step-time ratios old/new, per step after the first.

    python -m benchmarks.ab_decisive_compare OUT ARM ROUNDS

Exits 1 when a record differs (each difference printed)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks import common
from benchmarks.common import int_at_least

TIMING = {"tokens_per_s", "gen_s", "step_s", "sync_s", "peak_mem_mb", "train_peak_mem_mb", "wall_s", "output_dir"}
ADDED = {"rollout_ratio_mean", "rollout_ratio_outside"}  # step-record keys added after 0395a0a


def records(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


def differences(old: list[dict], new: list[dict]) -> list[str]:
    if len(old) != len(new):
        return [f"{len(old)} records against {len(new)}"]
    out = []
    for a, b in zip(old, new, strict=True):
        keys = (set(a) | set(b)) - TIMING - ADDED
        diff = {k: (a.get(k), b.get(k)) for k in sorted(keys) if a.get(k) != b.get(k)}
        if diff:
            out.append(f"step {a.get('step')} {a.get('event', '')}: {diff}")
    return out


def busy(r: dict) -> float:
    """The step's time without the rollout and the engine's weight sync."""
    return r["step_s"] - r["gen_s"] - r.get("sync_s", 0.0)


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=common.prog("ab_decisive_compare"), description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="the folder ab_decisive_step.sh wrote its runs into")
    ap.add_argument("arm", help="the arm it ran (its run folders are ARM-old-rN and ARM-new-rN)")
    ap.add_argument("rounds", type=int_at_least(1), help="how many rounds it ran")
    args = ap.parse_args(argv)
    missing = [f"{args.arm}-{side}-r{r}" for r in range(1, args.rounds + 1) for side in ("old", "new")
               if not (args.out / f"{args.arm}-{side}-r{r}" / "metrics.jsonl").is_file()]  # fmt: skip
    if missing:
        ap.error(f"{args.out}: no metrics.jsonl in {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    out, arm, rounds = args.out, args.arm, args.rounds
    ratios, rest, bad = [], [], 0
    for r in range(1, rounds + 1):
        old, new = (records(out / f"{arm}-{side}-r{r}") for side in ("old", "new"))
        for line in differences(old, new):
            bad += 1
            print(f"DIFF round {r} {line}")
        steps = [(a, b) for a, b in zip(old, new, strict=True) if "event" not in a and a["step"] >= 2]
        for a, b in steps:
            ratios.append(a["step_s"] / b["step_s"])
            rest.append(busy(a) / busy(b))
            print(f"round {r} step {a['step']}: old {a['step_s']:.2f} s, new {b['step_s']:.2f} s, old/new "
                  f"{ratios[-1]:.3f} (without rollout and sync {rest[-1]:.3f})")  # fmt: skip
    print(f"records: {'all equal' if not bad else f'{bad} differ'} (timings and {sorted(ADDED)} left out)")
    if not ratios:
        print("no step after the first in these runs: no step-time ratio to report", file=sys.stderr)
        return 1
    print(f"{len(ratios)} paired steps: step_s old/new median {statistics.median(ratios):.3f}, geometric mean "
          f"{statistics.geometric_mean(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}; without rollout "
          f"and sync: median {statistics.median(rest):.3f}, geometric mean {statistics.geometric_mean(rest):.3f}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
