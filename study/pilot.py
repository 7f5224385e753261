"""Study v2, phase 3 (the pilot for generality): its measurements, recomputed from the run folders by one command.

    python -m study.pilot benchmarks/results/study/v2-phase3            # prints the tables
    python -m study.pilot benchmarks/results/study/v2-phase3 --check    # exit 1 if pilot.md's tables differ

Reads, under the folder:
- every base measurement, a folder holding `config.json` and `heldout.jsonl` of a `--max-steps 0` run (the task
  screens `task-*`, a model's base evaluation): held-out problems, base accuracy with its binomial standard error,
  completions at the token limit, median completion tokens; for a SmolLM2 task, the pre-registered rule of section 5
  (docs/study-v2-preregistration.md): base accuracy in [0.15, 0.60] and at most 10% of completions at the limit;
- every finished training run under `*/runs/ARM/seedK` (the second model's pilot runs): steps, held-out before and
  after, mean step time.

pilot.md holds the tables between `<!-- pilot-tables -->` markers exactly as printed here."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from .results import finished_runs, read_records, read_summary

BAND = (0.15, 0.60)  # base accuracy a task must have (section 5)
LIMIT_MAX = 0.10  # the largest share of base completions at the token limit (section 5)
RULE_MODEL = "smollm2-135m"  # the rule screens tasks on the base SmolLM2; another model's row is a measurement only
MARK = "<!-- pilot-tables -->"


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())["train"]


def _heldout(folder: Path) -> list[dict]:
    with open(folder / "heldout.jsonl") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def task_label(cfg: dict) -> str:
    """The task as its flags name it: `arithmetic 2,3,5`, `wordproblems`."""
    return f"arithmetic {cfg['difficulty']}" if cfg["task"] == "arithmetic" else cfg["task"]


def base_measure(folder: Path) -> dict:
    """One base evaluation's numbers (the "before" column of its heldout.jsonl) and, for a SmolLM2 task, the rule."""
    cfg, rows = _config(folder), _heldout(folder)
    if not rows:
        raise ValueError(f"{folder / 'heldout.jsonl'}: no held-out problem in it")
    missing = [r.get("id") for r in rows if r.get("before_hit_limit") is None or r.get("before_tokens") is None]
    if missing:
        raise ValueError(f"{folder / 'heldout.jsonl'}: problems {missing[:5]} lack before_tokens / before_hit_limit "
                         "(written by a trainer older than the v2 study)")  # fmt: skip
    n = len(rows)
    correct = sum(bool(r["before"]) for r in rows)
    at_limit = sum(bool(r["before_hit_limit"]) for r in rows)
    acc, limit = correct / n, at_limit / n
    m = {
        "folder": folder.name, "model": cfg["model"], "task": task_label(cfg), "tokens": cfg["max_new_tokens"],
        "n": n, "correct": correct, "acc": acc, "se": math.sqrt(acc * (1 - acc) / n), "at_limit": at_limit,
        "limit": limit, "median_tokens": statistics.median(r["before_tokens"] for r in rows),
    }  # fmt: skip
    m["verdict"] = verdict(acc, limit) if Path(cfg["model"]).name == RULE_MODEL else "- (model measurement)"
    return m


def verdict(acc: float, limit: float) -> str:
    """Section 5's rule on one task: 'yes', or 'no: ' and every condition it fails."""
    why = []
    if not BAND[0] <= acc <= BAND[1]:
        why.append(f"accuracy {'<' if acc < BAND[0] else '>'} {BAND[0 if acc < BAND[0] else 1]:.2f}")
    if limit > LIMIT_MAX:
        why.append(f"limit > {LIMIT_MAX:.0%}")
    return "no: " + ", ".join(why) if why else "yes"


def run_measure(run_dir: Path) -> dict:
    """A finished training run: its arm, seed, steps, held-out before -> after and mean step time."""
    summary, cfg = read_summary(run_dir), _config(run_dir)
    steps = [r for r in read_records(run_dir) if "step_s" in r and r.get("event") is None]
    return {
        "arm": run_dir.parent.name, "seed": run_dir.name, "model": cfg["model"], "task": task_label(cfg),
        "steps": summary["steps"], "before": summary["before"]["eval_acc"], "after": summary["after"]["eval_acc"],
        "step_s": statistics.fmean(r["step_s"] for r in steps) if steps else float("nan"),
        "reward_first": steps[0].get("reward_mean") if steps else None,
        "reward_last10": statistics.fmean(r["reward_mean"] for r in steps[-10:]) if steps else None,
    }  # fmt: skip


def collect(root: Path) -> tuple[list[dict], list[dict]]:
    """(base measurements, finished training runs) under `root`, each sorted by folder name."""
    if not root.is_dir():
        raise ValueError(f"{root}: not a folder")
    bases = [base_measure(p) for p in sorted(root.iterdir()) if (p / "heldout.jsonl").is_file()
             and (p / "config.json").is_file() and _config(p)["max_steps"] == 0]  # fmt: skip
    # a table of what finished, not the report: its runs are not checked as the report checks them (check_runs)
    runs = [run_measure(r) for study in sorted(root.iterdir()) if (study / "runs").is_dir()
            for r in finished_runs(study, check=False)]  # fmt: skip
    return bases, runs


def tables(root: Path) -> str:
    """The markdown tables of every base measurement and every finished pilot run under `root`."""
    bases, runs = collect(root)
    out = [
        "| folder | model | task | token limit | held-out problems | base accuracy (+- s.e.) (correct) "
        "| at the limit | completion tokens, median | qualifies (section 5) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in bases:
        out.append(
            f"| {m['folder']} | {Path(m['model']).name} | {m['task']} | {m['tokens']} | {m['n']} "
            f"| {m['acc']:.3f} +- {m['se']:.3f} ({m['correct']}) | {m['limit']:.1%} ({m['at_limit']}) "
            f"| {m['median_tokens']:g} | {m['verdict']} |"
        )
    if runs:
        out += ["", "| run | model | task | steps | held-out before -> after | reward, step 1 -> mean of the last 10 "
                "| step s (mean) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in runs:
            out.append(
                f"| {r['arm']} {r['seed']} | {Path(r['model']).name} | {r['task']} | {r['steps']} "
                f"| {r['before']:.3f} -> {r['after']:.3f} | {r['reward_first']:.3f} -> {r['reward_last10']:.3f} "
                f"| {r['step_s']:.1f} |"
            )
    return "\n".join(out) + "\n"


def published_tables(pilot_md: Path) -> str | None:
    """The text between the two MARK lines of pilot.md (None without them, or without the file)."""
    if not pilot_md.is_file():
        return None
    parts = pilot_md.read_text().split(MARK + "\n")
    return parts[1] if len(parts) == 3 else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m study.pilot", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="phase 3's results folder (benchmarks/results/study/v2-phase3)")
    p.add_argument("--check", action="store_true", help="compare with FOLDER/pilot.md's tables; exit 1 if they differ")
    args = p.parse_args(argv)
    try:
        text = tables(args.folder)
    except KeyError as e:
        print(f"study.pilot: a config.json or summary.json under {args.folder} lacks the key {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"study.pilot: {e}", file=sys.stderr)
        return 2
    if args.check:
        return check(args.folder / "pilot.md", text)
    print(text, end="")
    return 0


def check(pilot_md: Path, text: str) -> int:
    """0 when pilot.md's tables are `text` (a line says so), else 1 with the tables the folders give."""
    same = published_tables(pilot_md) == text
    report = "match the run folders" if same else f"differ from the run folders':\n{text}"
    print(f"study.pilot: {pilot_md}'s tables {report}", file=sys.stdout if same else sys.stderr)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
