"""Where one training step's time goes, pass by pass, measured from outside the trainer.

`python -m benchmarks.profile_step --regime decisive --arm grpo_nokl` runs a short training run of the trainer
(`python -m train`, in this process) with the study's regime and arm flags, and wraps the trainer's functions from
the outside (no change to train/; the targets are listed in `benchmarks.step_passes.install`): the rollout engine's
generate and weight sync, the policy forwards (with grad in the loss, train/loss.py; forward-only for the reference,
the KL-from-init probe and the mechanism measurement), every LM-head op call (`linear_logprobs`, also the one inside
`sgrpo_loss`, sgrpo_kernels/rl/fused.py, whose log-probs also feed the sampler correction), counted and timed with
the trainer function that made it, the LM head's own backward, the rest of the backward, gradient clipping, the
optimizer step, the weight snapshots (trust region, mechanism), the features' hooks, advantages, the step record.
A target that is not found is reported ("not wrapped"): its time then lands in its caller's row.

Each wrapped call's time is split into its own ("self") time and the time of the wrapped calls inside it, so the rows
of one step add up to the step. The first `--warmup` steps are left out. Every forward and LM-head call is also
fingerprinted (the model's or head's weights and their version counters, the batch, the hidden states): a call whose
fingerprint matches an earlier call of the same step computes a result that step already has; such a call is flagged
"duplicate" and the step time without the duplicates is the floor of removing repeated work.

`--phases` (e.g. `--regime default --phases`, the default job exactly: `python -m train` with no flags) times the
whole job by phase instead: imports, model load, the rest of setup, the KL probe set-up, the held-out evals, the steps,
checkpoints, the model export.

Run the decisive regime with the vLLM environment's python (the study samples with vLLM):
  PYTHONPATH=$PWD /tmp/sgrpo-ci-venvs/vllm/bin/python -m benchmarks.profile_step --regime decisive --arm grpo_nokl

`--publish` writes benchmarks/results/step_profile_cpu.{md,json}. The earlier profile,
benchmarks/results/step_profile_cpu_7fda393.md (before the first pass's second LM head was removed), was made at
commit 7fda393 (train/update.py, train/mechanism.py); `install` still knows that layout, so this script at that
commit's train/ reproduces it, with the same row labels.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from . import common
from .common import RESULTS, git_sha, markdown_table
from .step_passes import PHASES, P, install, summarize

# ------------------------------------------------------------------------------------------------ one profiled run


def arm_flags(name: str) -> list[str]:
    """The trainer flags of a study arm (preset, loss overrides, the arm's trainer flags), as the study passes them."""
    try:
        from train.study.grid import ARMS, RESEARCH_ARMS
    except ImportError:  # the study moved to its own package
        from study.grid import ARMS, RESEARCH_ARMS
    arm = {**ARMS, **RESEARCH_ARMS}[name]
    out = ["--preset", arm.preset, "--loss", arm.loss]
    for k, v in arm.train.items():
        out += [f"--{k.replace('_', '-')}", v]
    return out


def regime_flags(name: str) -> dict[str, str]:
    try:
        from train.study.grid import REGIMES
    except ImportError:
        from study.grid import REGIMES
    return dict(REGIMES[name])


def trainer_argv(args, out_dir: str) -> list[str]:
    """The `python -m train` arguments of the profiled run."""
    if args.phases:  # the job exactly as given (the default job: no flags), only its output directory moved
        return ["--output-dir", out_dir, "--overwrite", *args.set]
    flags = regime_flags(args.regime) if args.regime != "default" else {}
    flags.update(max_steps=str(args.warmup + args.steps), eval_problems=str(args.eval_problems), eval_k="0")
    for item in args.set:
        k, _, v = item.partition("=")
        flags[k.replace("-", "_")] = v
    argv = ["--output-dir", out_dir, "--seed", str(args.seed), *arm_flags(args.arm), "--threads", str(args.threads)]
    argv += ["--progress", "false", "--save-model", "false", "--overwrite"]
    for k, v in flags.items():
        argv += [f"--{k.replace('_', '-')}", v]
    return argv


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def environment() -> dict:
    from train.run.machine import cpu_info, cpu_label

    info = {"cpu": cpu_label(), "bf16": [f for f in cpu_info()["isa"] if "bf16" in f] or "none (no avx512_bf16/amx)",
            "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "git_sha": git_sha()}  # fmt: skip
    for name in ("transformers", "vllm"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            pass
    return info


def profile_one(args) -> dict:
    PHASES["on"] = args.phases
    t_import = time.perf_counter()
    import train.__main__ as entry

    missing = install(args.phases)
    t_import = time.perf_counter() - t_import
    out_dir = args.output_dir or tempfile.mkdtemp(prefix="profile_step_")
    argv = trainer_argv(args, out_dir)
    load = {"start": uptime()}
    t0 = time.perf_counter()
    rc = entry.main(argv)
    wall = time.perf_counter() - t0
    load["end"] = uptime()
    raw = {"wall_s": wall, "load": load, "phases": P.phases, "calls": P.calls, "argv": argv, "rc": rc,
           "import_s": t_import, "not_wrapped": missing, "peak_rss_mb": _peak_rss_mb(), "out_dir": out_dir}  # fmt: skip
    (args.out / f"raw_{'phases' if args.phases else args.arm}.pyjson").write_text(json.dumps(raw, default=str))
    return finish(args, raw)


def finish(args, raw: dict) -> dict:
    """The result of a profiled run from its raw record (also one a run left before it was interrupted: a Ctrl-C /
    SIGTERM checkpoints the run, which then has fewer steps; only the phases mode reports such a run)."""
    argv = raw["argv"]
    out_dir = raw.get("out_dir") or argv[argv.index("--output-dir") + 1]
    summary = json.loads((Path(out_dir) / "summary.json").read_text())
    rc = raw.get("rc")
    if rc is None:  # a raw record of an earlier version of this script
        rc = 143 if summary.get("interrupted") else 0
    if rc and not (args.phases and rc in (130, 143)):
        raise SystemExit(f"the trainer exited with status {rc}")
    try:
        from train.config.cli import parse_args
    except ImportError:  # the layout of 7fda393
        from train.cli import parse_args

    cfg, _ = parse_args(argv)
    result = {"regime": args.regime, "arm": None if args.phases else args.arm, "phases_mode": args.phases,
              "trainer_argv": argv, "threads": args.threads, "wall_s": raw["wall_s"], "import_s": raw.get("import_s"),
              "load": raw["load"], "not_wrapped": raw.get("not_wrapped"), "env": environment(), "interrupted": bool(rc),
              "summary": summary}  # fmt: skip
    recs = [json.loads(x) for x in (Path(out_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in recs if "step_s" in r and r.get("event") is None]
    result["step_s_recorded"] = [r["step_s"] for r in steps]
    result["max_steps"] = cfg.max_steps
    if args.phases:
        agg: dict[str, list[float]] = defaultdict(list)
        for label, sec in raw["phases"]:
            agg[label].append(sec)
        result["phases"] = [{"phase": k, "calls": len(v), "s": sum(v)} for k, v in agg.items()]
        result["peak_rss_mb"] = raw.get("peak_rss_mb") or args.peak_rss_mb
    else:
        calls = {int(k): v for k, v in raw["calls"].items()}
        measured = [st for st in sorted(calls) if st > args.warmup]
        result["profile"] = summarize(calls, measured, cfg.kl_every)
        result["step_s_recorded_measured"] = [r["step_s"] for r in steps if r.get("step", 0) > args.warmup]
    return result


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------------------------------------- report


def fmt_profile(res: dict) -> str:
    p = res["profile"]
    rows = [{"pass": r["pass"] + (" **DUPLICATE** of: " + "; ".join(r["duplicate_of"]) if r["duplicate_of"] else ""),
             "calls/step": f"{r['calls_per_step']:.2f}", "s/step": f"{r['s_per_step']:.3f}",
             "share": f"{100 * r['share']:.1f}%"} for r in p["rows"]]  # fmt: skip
    rec = res.get("step_s_recorded_measured") or []
    lines = [
        f"### {res['regime']} regime, arm `{res['arm']}` ({len(p['measured_steps'])} measured steps "
        f"{p['measured_steps']}, threads {res['threads']})",
        "",
        markdown_table(rows, ["pass", "calls/step", "s/step", "share"]),
        "",
        f"- step (sum of the rows): **{p['step_s']:.2f} s**; the trainer's own `step_s` of the measured steps: "
        + ", ".join(f"{x:.2f}" for x in rec)
        + " s (the KL probe joins `step_s` only on its steps, one in "
        f"{p['kl_every']}: its rows count at that rate)",
        f"- duplicates: **{p['duplicate_s']:.2f} s/step** ({100 * p['duplicate_s'] / p['step_s']:.1f}%); floor without "
        f"them: **{p['floor_s']:.2f} s/step** (x{p['step_s'] / p['floor_s']:.2f} faster at most from removing them)",
        f"- load: start `{res['load']['start']}`; end `{res['load']['end']}`",
        f"- not wrapped (absent in this trainer): {res['not_wrapped'] or 'none'}",
        "",
    ]
    return "\n".join(lines)


def fmt_phases(res: dict) -> str:
    total = res["wall_s"] + (res["import_s"] or 0.0)
    rows = []
    if res["import_s"] is not None:
        rows.append({"phase": "imports (train, torch, transformers)", "calls": 1, "s": f"{res['import_s']:.1f}",
                     "share": f"{100 * res['import_s'] / total:.1f}%"})  # fmt: skip
    nested = ("model load", "rollout engine", "KL probe set-up")  # inside "setup (all of it)"
    for ph in res["phases"]:
        inner = ph["phase"].startswith(nested)
        rows.append({"phase": ("  - " if inner else "") + ph["phase"], "calls": ph["calls"], "s": f"{ph['s']:.1f}",
                     "share": f"{100 * ph['s'] / total:.1f}%"})  # fmt: skip
    known = (res["import_s"] or 0.0) + sum(p["s"] for p in res["phases"] if not p["phase"].startswith(nested))
    rows.append({"phase": "rest (CLI, run directory, summary, exit)", "calls": "", "s": f"{total - known:.1f}",
                 "share": f"{100 * (total - known) / total:.1f}%"})  # fmt: skip
    steps = res["step_s_recorded"]
    s = res["summary"]
    start = "the imports" if res["import_s"] is not None else "the trainer's start (imports not timed)"
    stopped = []
    if res.get("interrupted") and steps:
        per = sum(steps) / len(steps)  # the whole steps (the step cut short is in the steps row)
        stopped = [
            f"- **interrupted** (SIGTERM, checkpointed) after {len(steps)} of {res['max_steps']} steps: at this load "
            f"the {res['max_steps']} steps would take ~{per * res['max_steps']:.0f} s ({per:.0f} s per whole step, "
            "the records' mean), and the eval after about as long as the eval before (the same problems); no export "
            "ran",
        ]
    return "\n".join(
        [
            f"### The default job by phase (`python -m train`, no flags; {len(steps)} steps)",
            "",
            markdown_table(rows, ["phase", "calls", "s", "share"]),
            "",
            f"- wall: **{total:.0f} s** ({total // 60:.0f}:{total % 60:02.0f}) from {start} to the end; the "
            f"summary's `wall_s` {s['wall_s']:.0f} s; peak RSS {res['peak_rss_mb'] / 1024:.2f} GiB",
            f"- the records' `step_s`: sum {sum(steps):.0f} s, mean {sum(steps) / max(len(steps), 1):.1f} s",
            f"- held-out: before {s.get('before', {}).get('eval_acc')}, after {s.get('after', {}).get('eval_acc')}",
            f"- load: start `{res['load']['start']}`; end `{res['load']['end']}`",
            *stopped,
            "",
        ]
    )


def report(folder: Path, publish: bool, command: str) -> Path:
    results = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json")) if p.name != "step_profile_cpu.json"]
    if not results:
        raise SystemExit(f"--report: no results (*.json) in {folder}")
    env = results[0]["env"]
    head = [
        "# One training step by pass (CPU)",
        "",
        "Measured by `benchmarks/profile_step.py` from outside the trainer (its functions wrapped; train/ unchanged). "
        "Each row is the self time of one kind of call (its time less the wrapped calls inside it), so the rows of a "
        "step add up to the step. A row marked DUPLICATE computed a result the same step already had (same weights "
        "and version counters, same batch / hidden states, same targets); the floor is the step without them.",
        "",
        "**The machine was SHARED with other jobs** (2 cores, several other sessions; load averages below): absolute "
        "seconds are inflated and noisy, only the shares and call counts are firm.",
        "",
        f"- CPU: {env['cpu']}; bf16 instructions: {env['bf16']}; {env['cores']} cores",
        f"- versions: python {env['python']}, torch {env['torch']}, transformers {env.get('transformers')}, vLLM "
        f"{env.get('vllm', 'not installed')} (per run below where they differ); git {env['git_sha']}",
        f"- command: `{command}`",
        "",
    ]
    body = []
    for res in results:
        body.append(fmt_phases(res) if res["phases_mode"] else fmt_profile(res))
        body.append(f"- trainer flags: `python -m train {' '.join(_quote(a) for a in res['trainer_argv'])}`; "
                    f"torch {res['env']['torch']}, transformers {res['env'].get('transformers')}, vLLM "
            f"{res['env'].get('vllm', 'none')}\n")  # fmt: skip
    text = "\n".join(head + body)
    dest = RESULTS if publish else folder
    (dest / "step_profile_cpu.md").write_text(text)
    (dest / "step_profile_cpu.json").write_text(json.dumps(results, indent=1, default=str))
    return dest / "step_profile_cpu.md"


def _quote(a: str) -> str:
    return repr(a) if (" " in a or not a) else a


def _check_args(ap: argparse.ArgumentParser, args) -> None:
    """Names, counts and --out refused up front (an unknown regime or arm was a KeyError in the child process, after
    a run folder was made)."""
    try:
        from train.study.grid import ARMS, REGIMES, RESEARCH_ARMS
    except ImportError:
        from study.grid import ARMS, REGIMES, RESEARCH_ARMS
    if args.regime not in REGIMES:
        ap.error(f"--regime {args.regime!r}: expected one of {', '.join(sorted(REGIMES))}")
    for arm in [args.arm] if args.arm else args.arms.split(","):
        if arm not in ARMS and arm not in RESEARCH_ARMS:
            ap.error(f"--arms: unknown arm {arm!r}; `python -m study --help` lists the arms")
    for flag, value, low in (("--steps", args.steps, 1), ("--warmup", args.warmup, 0), ("--threads", args.threads, 1),
                             ("--eval-problems", args.eval_problems, 1)):  # fmt: skip
        if value < low:
            ap.error(f"{flag} {value}: expected an integer >= {low}")
    if not args.report and not args.finish_raw:
        from benchmarks.common import check_out

        check_out(ap, "--out", args.out, "dir")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=common.prog("profile_step"), description=__doc__.split("\n\n")[0])
    ap.add_argument("--regime", default="decisive", help="the study's regime (train/study/grid.py REGIMES) or default")
    ap.add_argument("--arms", default="grpo_nokl", help="comma-separated study arms, each profiled in its own process")
    ap.add_argument("--arm", default=None, help=argparse.SUPPRESS)  # one arm, in this process (what --arms runs)
    ap.add_argument("--steps", type=int, default=4, help="measured steps")
    ap.add_argument("--warmup", type=int, default=1, help="steps run first and left out")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the study: 1 per worker)")
    ap.add_argument("--eval-problems", type=int, default=8, help="held-out problems (eval is not part of a step)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="more trainer overrides")
    ap.add_argument("--phases", action="store_true", help="time the whole job by phase (the job as given: no flags)")
    ap.add_argument("--output-dir", default=None, help="the trainer's run directory (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench/profile_step"), help="where each run's JSON goes")
    ap.add_argument("--report", action="store_true", help="only write the markdown/JSON from the JSONs in --out")
    ap.add_argument("--publish", action="store_true", help="write the report to benchmarks/results/")
    ap.add_argument("--finish-raw", type=Path, default=None, help="rebuild a run's JSON from its raw_*.pyjson record")
    ap.add_argument("--peak-rss-mb", type=float, default=None, help=argparse.SUPPRESS)  # for a raw record without it
    args = ap.parse_args(argv)
    _check_args(ap, args)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.profile_step " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.report:
        print(report(args.out, args.publish, command))
        return 0
    if args.phases or args.arm:
        res = finish(args, json.loads(args.finish_raw.read_text())) if args.finish_raw else profile_one(args)
        name = "default_phases" if args.phases else f"{args.regime}_{args.arm}"
        (args.out / f"{name}.json").write_text(json.dumps(res, indent=1, default=str))
        print(fmt_phases(res) if args.phases else fmt_profile(res))
        return 0
    rest = [a for a in (sys.argv[1:] if argv is None else argv)]
    for arm in args.arms.split(","):  # one process per arm: each run has its own engine and wrappers
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}  # as the study starts its runs
        rc = subprocess.call([sys.executable, "-m", "benchmarks.profile_step", *rest, "--arm", arm], env=env)
        if rc:
            return rc
    print(report(args.out, args.publish, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
