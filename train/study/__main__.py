"""python -m train.study: a grid of arms x seeds under one regime, resumable, then its report. docs/study.md."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..study.grid import ARMS, REGIMES, RESEARCH_ARMS, grid, parse_sets
from ..study.report import write_report
from ..study.results import finished_runs
from ..study.runner import Manifest, run_grid

RESULTS = Path("benchmarks/results/study")
WORK = Path("runs/study")


def _ints(text: str) -> list[int]:
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} refused: expected comma-separated seeds, e.g. 0,1,2") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} refused: expected one or more seeds >= 0, e.g. 0,1,2")
    return out


def _arms(text: str) -> list[str]:
    """Names from ARMS (the main comparison) or RESEARCH_ARMS; the default (no --arms) is ARMS only."""
    names = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in names if a not in ARMS and a not in RESEARCH_ARMS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{text!r} refused: expected arms from {', '.join(ARMS)} (main) or {', '.join(RESEARCH_ARMS)} (research)"
        )
    return list(dict.fromkeys(names))


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} refused: expected an integer >= 1")
    return n


def build_parser() -> argparse.ArgumentParser:
    def listing(table: dict) -> str:
        return "\n".join(f"  {a.name:<16} {a.preset:<8} loss {a.loss or '(as is)'}: {a.about}" for a in table.values())

    arms = f"{listing(ARMS)}\n\nresearch arms (only when named in --arms):\n{listing(RESEARCH_ARMS)}"
    regimes = "\n".join(f"  {k:<15} {' '.join(f'--{f} {v}' for f, v in o.items())}" for k, o in REGIMES.items())
    p = argparse.ArgumentParser(
        prog="python -m train.study",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a stability study (arms x seeds under one regime) with the bundled trainer, then report it.\n"
        "Each run is its own `python -m train` process; finished runs are skipped, interrupted ones resume.",
        epilog=f"arms:\n{arms}\n\nregimes (trainer overrides on every arm; --set adds more):\n{regimes}\n\n"
        "Results: OUT/runs/ARM/seedK/{config.json,metrics.jsonl,summary.json}, OUT/manifest.json, "
        "OUT/study.{csv,json,md,png}.",
    )
    p.add_argument("--regime", default="default", choices=sorted(REGIMES), help="named trainer overrides [default]")
    p.add_argument("--name", help="the study's name (its results folder); default: the regime's name")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="extra trainer override")
    p.add_argument("--arms", type=_arms, default=list(ARMS), help="comma-separated arms [every main arm]")
    p.add_argument("--seeds", type=_ints, default=[0, 1, 2], help="comma-separated seeds [0,1,2]")
    p.add_argument("--workers", type=_positive, default=1, help="runs at a time [1]")
    p.add_argument(
        "--threads", type=_positive, help="CPU threads per run [cores // workers]; the runs share the machine's cores"
    )
    p.add_argument("--out", type=Path, help=f"results folder [{RESULTS}/NAME]")
    p.add_argument("--work", type=Path, help=f"where runs train and keep checkpoints [{WORK}/NAME]")
    p.add_argument("--report", type=Path, metavar="DIR", help="only aggregate the finished runs in DIR (no training)")
    p.add_argument("--no-figure", action="store_true", help="skip study.png")
    p.add_argument("--progress", type=lambda t: t.lower() not in ("0", "false", "no", "off"), default=True)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.report is not None:
        if not (args.report / "runs").is_dir():
            print(f"--report {args.report}: no runs/ folder there (expected a study's results folder)", file=sys.stderr)
            return 2
        write_report(args.report, figure=not args.no_figure)
        print(f"report: {args.report / 'study.md'}")
        return 0
    name = args.name or args.regime
    out, work = args.out or RESULTS / name, args.work or WORK / name
    try:
        overrides = {**REGIMES[args.regime], **parse_sets(args.set)}
        specs = grid(args.arms, args.seeds, overrides, work, out)
        for spec in specs:
            spec.config()  # every run's arguments, checked before the first starts
        manifest = Manifest(out, name, overrides, {spec.arm.name: spec.arm.as_dict() for spec in specs})
    except ValueError as exc:
        print(f"python -m train.study: {exc}", file=sys.stderr)
        return 2
    manifest.save()
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    try:
        finished, failed = run_grid(specs, manifest, args.workers, threads, progress=args.progress)
    except KeyboardInterrupt:
        print("\nstudy interrupted: running trainers checkpointed; the same command resumes", file=sys.stderr)
        return 130
    if finished_runs(out):
        write_report(out, order=args.arms, figure=not args.no_figure)
        print(f"report: {out / 'study.md'}")
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(failed)} (logs under {work}); rerun to retry", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
