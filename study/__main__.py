"""python -m study: a grid of arms x seeds under one regime, resumable, then its report. docs/study.md."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from .grid import ARMS, REGIMES, RESEARCH_ARMS, grid, parse_seeds, parse_sets
from .report import write_report
from .results import finished_runs, stray_folders
from .runner import Manifest, run_grid

RESULTS = Path("benchmarks/results/study")
WORK = Path("runs/study")


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


def _threads(text: str) -> int:
    """--threads: at least 1, at most the machine's CPU count (a larger count oversubscribes it; a huge one makes every
    trainer abort in the OpenMP runtime after the study has started)."""
    n, cores = _positive(text), os.cpu_count() or 1
    if n > cores:
        raise argparse.ArgumentTypeError(f"{text!r} refused: this machine has {cores} CPU(s); expected at most {cores}")
    return n


def _name(text: str) -> str:
    """--name: one plain folder name (it is joined to the results and work folders), never a path."""
    if text in ("", ".", "..") or text != text.strip() or any(c in text for c in "/\\\0"):
        raise argparse.ArgumentTypeError(
            f"{text!r} refused: expected a single plain folder name (no '/', not '.' or '..'), e.g. stress-lr5e-4"
        )
    return text


def _switch(text: str) -> bool:
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} refused: expected true or false (or yes/no, on/off, 1/0)")


def _set_key(item: str) -> str:
    return item.partition("=")[0].strip().replace("-", "_")


def duplicated_sets(items: list[str], where: str = "") -> str | None:
    """What is wrong when two `--set` items name the same field (max-steps and max_steps included), else None;
    `where`: the --config file they came from, when they did."""
    seen: dict[str, str] = {}
    for item in items:
        key = _set_key(item)
        if key in seen:
            return f"{where}--set {seen[key]!r} and --set {item!r}: {key} given twice; give each field once"
        seen[key] = item
    return None


def merged_sets(from_file: list[str], typed: list[str], path: str | None) -> list[str]:
    """The --set items of a call: the --config file's, less the fields typed again, then the typed ones (typed flags
    win over the file). Each list must name a field once: a ValueError else (naming the file for its own)."""
    if problem := duplicated_sets(from_file, f"--config {path}: ") or duplicated_sets(typed):
        raise ValueError(problem)
    keys = {_set_key(item) for item in typed}
    return [item for item in from_file if _set_key(item) not in keys] + typed


def nested_work(work: Path, out: Path) -> str | None:
    """What is wrong when --work is --out or inside it (its runs/ included), else None: unfinished runs' checkpoints and
    logs would land in the results folder (and a run's work folder could be its results folder)."""
    w, o = work.resolve(), out.resolve()
    if w == o or w.is_relative_to(o):
        return (f"--work {work} is --out {out} or inside it: unfinished runs' checkpoints would land in the results; "
                "choose a --work outside --out")  # fmt: skip
    return None


def unwritable(flag: str, folder: Path) -> str | None:
    """What is wrong when nothing can be written in `folder` (made when missing), else None."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return f"{flag} {folder}: cannot write there ({exc.strerror or exc}); choose a folder you can write to"
    return None


def build_parser() -> argparse.ArgumentParser:
    def listing(table: dict) -> str:
        return "\n".join(f"  {a.name:<16} {a.preset:<8} loss {a.loss or '(as is)'}: {a.about}" for a in table.values())

    arms = f"{listing(ARMS)}\n\nresearch arms (only when named in --arms):\n{listing(RESEARCH_ARMS)}"
    regimes = "\n".join(f"  {k:<15} {' '.join(f'--{f} {v}' for f, v in o.items())}" for k, o in REGIMES.items())
    p = argparse.ArgumentParser(
        prog="sgrpo-study" if Path(sys.argv[0]).name == "sgrpo-study" else f"python -m {__package__}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a stability study (arms x seeds under one regime) with the bundled trainer, then report it.\n"
        "Each run is its own `python -m train` process; finished runs are skipped, interrupted ones resume.",
        epilog=f"arms:\n{arms}\n\nregimes (trainer overrides on every arm; --set adds more):\n{regimes}\n\n"
        "Results: OUT/runs/ARM/seedK/{config.json,metrics.jsonl,summary.json}, OUT/manifest.json, "
        "OUT/study.{csv,json,md,png}.",
    )
    p.add_argument("--regime", default="default", choices=sorted(REGIMES), help="named trainer overrides [default]")
    p.add_argument("--name", type=_name, help="the study's name (its results folder); default: the regime's name")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="extra trainer override")
    p.add_argument("--arms", type=_arms, default=list(ARMS), help="comma-separated arms [every main arm]")
    p.add_argument("--seeds", type=parse_seeds, default=[0, 1, 2], help="comma-separated seeds [0,1,2]")
    p.add_argument("--workers", type=_positive, default=1, help="runs at a time [1]")
    p.add_argument(
        "--threads",
        type=_threads,
        help="CPU threads per run, at most the machine's cores [cores // workers]; the runs share the machine's cores",
    )
    p.add_argument("--out", type=Path, help=f"results folder [{RESULTS}/NAME]")
    p.add_argument("--work", type=Path, help=f"where runs train and keep checkpoints [{WORK}/NAME]")
    p.add_argument("--report", type=Path, metavar="DIR", help="only aggregate the finished runs in DIR (no training)")
    p.add_argument("--no-figure", action="store_true", help="skip study.png")
    p.add_argument("--progress", type=_switch, default=True, metavar="BOOL",
                   help="a progress bar over the grid, true or false [true]")  # fmt: skip
    p.add_argument("--config", metavar="FILE", help="a YAML/JSON mapping of these options (flags typed win)")
    return p


def config_argv(path: str) -> list[str]:
    """A --config file (YAML or JSON mapping of the options below, as `regime: default`, `seeds: [0, 1]`,
    `set: [max_steps=10]`) as the flags it stands for; an unknown key or a file that is not such a mapping is a
    ValueError naming it. Flags typed on the command line come after, so they win."""
    from .trainer import ConfigFileError
    from .trainer import read_config_text as _parse_text

    options = {a.dest: a for a in build_parser()._actions if a.option_strings and a.dest not in ("help", "config")}
    if Path(path).is_dir():
        raise ValueError(f"--config {path}: a folder; expected a YAML or JSON file of options")
    try:
        data = _parse_text(Path(path))  # a missing file: refused naming it
    except ConfigFileError as exc:
        raise ValueError(str(exc)) from None
    except OSError as exc:
        raise ValueError(f"--config {path}: cannot read it ({exc.strerror or exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a mapping of options (regime: default, seeds: [0, 1], ...)")
    out = []
    for key, value in data.items():
        action = options.get(str(key).replace("-", "_"))
        if action is None:
            raise ValueError(f"--config {path}: unknown key {key!r}; expected one of {', '.join(sorted(options))}")
        flag = action.option_strings[0]
        if value is None:  # `out: null`: the option's default, as if the key were absent
            continue
        if action.nargs == 0:  # --no-figure: a boolean, or the words --progress takes
            try:
                out += [flag] if (value if isinstance(value, bool) else _switch(str(value))) else []
            except argparse.ArgumentTypeError as exc:
                raise ValueError(f"--config {path}: key {key!r}: {exc}") from None
        elif action.dest == "set":
            out += [a for v in (value if isinstance(value, list) else [value]) for a in (flag, str(v))]
        else:
            text = ",".join(map(str, value)) if isinstance(value, list) else str(value).lower() if isinstance(
                value, bool) else str(value)  # fmt: skip
            out += [flag, text]
    return out


def report_problem(folder: Path, order: list[str] | None, figure: bool) -> str | None:
    """Writes the report of the study in `folder`; None when it was written, else why not, in one line: a run's files
    refused (e.g. a heldout.jsonl that disagrees with its summary.json, named by the report) or a folder that cannot be
    written."""
    for stray in stray_folders(folder):
        print(f"warning: {stray}: not a run folder (runs/ARM/seedK, K the run's seed); not reported", file=sys.stderr)
    try:
        write_report(folder, order=order, figure=figure)
    except ValueError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot write the report there ({type(exc).__name__}: {exc.strerror or exc})"
    return None


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # (during the checks before the runs, or the report after them: run_grid says its own)
        print("\npython -m study: interrupted; finished runs stay published, the same command continues",
              file=sys.stderr)  # fmt: skip
        return 130


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    first = build_parser().parse_args(argv)
    if sum(a == "--config" or a.startswith("--config=") for a in argv) > 1:  # argparse would keep the last silently
        print("python -m study: --config given more than once; give one file", file=sys.stderr)
        return 2
    if first.config is not None:
        try:
            argv = config_argv(first.config) + argv
        except ValueError as exc:
            print(f"python -m study: {exc}", file=sys.stderr)
            return 2
    args = build_parser().parse_args(argv)
    from_file = args.set[: len(args.set) - len(first.set)]  # the file's flags come first
    if args.report is not None:
        if not (args.report / "runs").is_dir():
            print(f"--report {args.report}: no runs/ folder there (expected a study's results folder)", file=sys.stderr)
            return 2
        if problem := report_problem(args.report, None, not args.no_figure):
            print(f"--report {args.report}: {problem}", file=sys.stderr)
            return 2
        extra = ("study_heldout.csv",) + (() if args.no_figure else ("study_forest.png", "study_curves.png"))
        extra = [n for n in extra if (args.report / n).is_file()]
        print(f"report: {args.report / 'study.md'}" + (f" (and {', '.join(extra)})" if extra else ""))
        return 0
    name = args.name or args.regime
    out, work = args.out or RESULTS / name, args.work or WORK / name
    try:
        if problem := nested_work(work, out):
            raise ValueError(problem)
        sets = merged_sets(from_file, first.set, first.config)
        overrides = {**REGIMES[args.regime], **parse_sets(sets)}
        specs = grid(args.arms, args.seeds, overrides, work, out)
        for spec in specs:
            spec.config()  # every run's arguments, checked before the first starts
        manifest = Manifest(out, name, overrides, {spec.arm.name: spec.arm.as_dict() for spec in specs})
    except ValueError as exc:
        print(f"python -m study: {exc}", file=sys.stderr)
        return 2
    for flag, folder in (("--out", out), ("--work", work)):
        if problem := unwritable(flag, folder):
            print(f"python -m study: {problem}", file=sys.stderr)
            return 2
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    try:
        finished, failed = run_grid(specs, manifest, args.workers, threads, progress=args.progress)
    except KeyboardInterrupt:
        print("\nstudy interrupted: running trainers checkpointed; the same command resumes", file=sys.stderr)
        return 130
    except ValueError as exc:  # a finished run in --out not this study's (check_unrecorded), a published run refused
        print(f"python -m study: {exc}", file=sys.stderr)
        return 2
    if finished_runs(out, check=False):  # the report checks them (a refusal is its problem)
        if problem := report_problem(out, None, not args.no_figure):  # the manifest's arm order, as --report
            print(f"python -m study: the runs are kept in {out}, but no report was written: {problem}",
                  file=sys.stderr)  # fmt: skip
            return 2
        print(f"report: {out / 'study.md'}")
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(failed)} (logs under {work}); rerun to retry", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
