"""The trainers end to end on one CPU job: the bundled `python -m train`, TRL's `GRPOTrainer` and this project's
`SGRPOTrainer` (TRL with the S-GRPO loss), each in its own process, on the same model, task, prompts per step, group
size, completion length, sampling temperature, learning-rate schedule, trained layers, threads and number of steps.

    python -m benchmarks.bench_trainers --steps 30               # scratch: runs/bench/trainers.{json,md}
    python -m benchmarks.bench_trainers --steps 30 --publish     # benchmarks/results/trainers_cpu.{json,md}
    python -m benchmarks.bench_trainers --steps 10 --trainers bundled,bundled-vllm-fp32,bundled-vllm-bf16,trl \
        --vllm-python /path/to/venv-vllm/bin/python                 # the bundled trainer per rollout engine

Every trainer is built from the bundled trainer's own setup (`train.setup.setup`: the model, its trained top layers,
the task, the held-out set) and evaluated by its own `train.evaluate.evaluate` (greedy held-out accuracy before and
after), so only the training loop differs. Per trainer: mean step time over the steps after the first (rollout,
loss, backward, optimizer step), completion tokens per second of step time, the peak resident memory of training
(VmHWM reset after setup, as the bundled trainer's `train_peak_mem_mb`) and of the whole process (ru_maxrss).
What differs by design: the training problems are drawn from the same task and seed but not in the same order
(TRL's sampler shuffles the dataset), the TRL trainers use their own loss (`GRPOTrainer`: TRL's default
`loss_type`; `SGRPOTrainer`: the `s_grpo` preset with the default job's quantile filter, as the bundled trainer).
Time the trainers only on an otherwise idle machine: they share its cores with nothing else.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common
from benchmarks.common import (
    RESULTS,
    check_out,
    cpu_name,
    git_sha,
    int_at_least,
    scratch_dir,
    script_args,
    trainer_module,
    versions,
    vllm_python_error,
)

REPO = Path(__file__).resolve().parents[1]
TRAINERS = ("bundled", "trl", "sgrpo", "bundled-vllm-fp32", "bundled-vllm-bf16", "bundled-vllm-bf16-sized")
DEFAULT_TRAINERS = ("bundled", "trl", "sgrpo")
# the bundled trainer's rollout engine per kind (docs/rollouts.md); the vLLM kinds run under --vllm-python
ENGINE_FLAGS = {
    "bundled": ["--use-vllm", "off"],
    "bundled-vllm-fp32": ["--use-vllm", "on", "--vllm-dtype", "float32"],
    "bundled-vllm-bf16": ["--use-vllm", "on", "--vllm-dtype", "bfloat16"],
    # the engine sized to the job's short sequences (its records equal the default engine's: tests/test_train_vllm.py)
    "bundled-vllm-bf16-sized": ["--use-vllm", "on", "--vllm-dtype", "bfloat16", "--vllm-max-model-len", "1024",
                                "--vllm-kv-cache-gb", "0.1"],
}  # fmt: skip
SCRATCH = scratch_dir()
TRL_MODULES = ("trl", "datasets")  # what the TRL workers import besides the trainer's own packages


# ------------------------------------------------------------------------------------------------- the arguments


def trainer_value(field: str):
    """The argparse `type` of a flag handed on to the bundled trainer as its field `field`: checked at parse time
    against the trainer's own declaration (train.config: e.g. --group-size >= 2, as `python -m train` refuses 1),
    not by a child process after the other trainers ran."""

    def parse(text: str):
        check = importlib.import_module(f"{trainer_module()}.config.train_config").parse_flag_text
        try:
            return check(field, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc} (the trainer's --{field.replace('_', '-')})") from None

    parse.__name__ = field
    return parse


def job_flags(args: argparse.Namespace, out: Path) -> list[str]:
    """The bundled trainer's flags of the job; the TRL workers parse the same ones (train.config.cli.parse_args)."""
    return ["--model", args.model, "--output-dir", str(out), "--overwrite", "--seed", str(args.seed),
            "--max-steps", str(args.steps), "--prompts-per-step", str(args.prompts), "--group-size",
            str(args.group_size), "--max-new-tokens", str(args.max_new_tokens), "--eval-problems",
            str(args.eval_problems), "--eval-k", "0", "--kl-every", "0", "--save-every", "0", "--progress", "false",
            "--threads", str(args.threads), "--preset", "s_grpo",
            "--mixed-precision", args.mixed_precision]  # fmt: skip


# ------------------------------------------------------------------------------------------------ the TRL workers


def trl_worker(kind: str, flags: list[str], result: Path) -> None:
    """One TRL run (in its own process): `kind` "trl" (GRPOTrainer) or "sgrpo" (SGRPOTrainer), on the job of
    `flags`; writes its measurements to `result` (JSON)."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from sgrpo_kernels.integrations.trl import SGRPOConfig, SGRPOTrainer
    from train.config import PRESET_LOSS_DEFAULTS
    from train.config.cli import parse_args
    from train.evaluate import evaluate
    from train.record import reset_train_peak, train_peak_mem_mb
    from train.rewards import correctness_reward
    from train.setup import setup

    cfg, overrides = parse_args(flags)
    run = setup(cfg, cfg.loss_config(overrides))
    rows = run.task.sample(cfg.max_steps * cfg.prompts_per_step, run.task_rng)
    system = [{"role": "system", "content": run.system_prompt}] if run.system_prompt else []
    ds = Dataset.from_list([{"prompt": system + [{"role": "user", "content": q.prompt}], "answer": q.answer}
                            for q in rows])  # fmt: skip

    def reward(completions, answer, **kwargs):
        return [correctness_reward(c[-1]["content"], a) for c, a in zip(completions, answer)]

    common = dict(
        output_dir=str(run.out_dir / "trl"), per_device_train_batch_size=cfg.prompts_per_step * cfg.group_size,
        num_generations=cfg.group_size, max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature,
        top_p=cfg.top_p, learning_rate=cfg.lr, lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": cfg.min_lr_ratio}, warmup_steps=cfg.warmup_steps,
        max_grad_norm=cfg.max_grad_norm, weight_decay=cfg.weight_decay, adam_beta2=0.99, max_steps=cfg.max_steps,
        beta=0.0, bf16=cfg.mixed_precision == "bf16", use_cpu=True, logging_steps=1, report_to=[], save_strategy="no",
        seed=cfg.seed, disable_tqdm=True,
    )  # fmt: skip
    if kind == "sgrpo":
        config = SGRPOConfig(**common, sgrpo_preset="s_grpo", sgrpo_loss=PRESET_LOSS_DEFAULTS["s_grpo"])
        trainer_cls = SGRPOTrainer
    else:
        config, trainer_cls = GRPOConfig(**common), GRPOTrainer

    step_s: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            step_s.append(time.perf_counter() - self.t0)

    trainer = trainer_cls(model=run.model, processing_class=run.tok, reward_funcs=reward, args=config,
                          train_dataset=ds, callbacks=[Clock()])  # fmt: skip
    before = evaluate(run.model, run.tok, run.heldout, cfg, system_prompt=run.system_prompt)
    reset_train_peak(run.device)
    t0 = time.time()
    trainer.train()
    wall = time.time() - t0
    peak = train_peak_mem_mb(run.device)
    after = evaluate(run.model, run.tok, run.heldout, cfg, system_prompt=run.system_prompt)
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    n = cfg.prompts_per_step * cfg.group_size
    tokens = [h["completions/mean_length"] * n for h in logs]
    out = {
        "trainer": kind, "steps": len(step_s), "step_s": step_s, "tokens": tokens, "train_wall_s": wall,
        "train_peak_mem_mb": peak, "peak_mem_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "heldout_before": before["eval_acc"], "heldout_after": after["eval_acc"],
        "loss_type": "s_grpo preset" if kind == "sgrpo" else f"TRL loss_type={config.loss_type}",
        "torch_threads": torch.get_num_threads(),
    }  # fmt: skip
    result.write_text(json.dumps(out))


# --------------------------------------------------------------------------------------------- the measurements


def run_trainer(kind: str, args: argparse.Namespace, work: Path) -> dict:
    out = work / kind
    flags = job_flags(args, out)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    if kind in ENGINE_FLAGS:
        python = args.vllm_python if kind != "bundled" else sys.executable
        cmd = [python, "-m", trainer_module(), *flags, *ENGINE_FLAGS[kind]]
    else:
        out.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, *script_args("bench_trainers"), "--worker", kind, "--worker-result",
               str(out / "worker.json"), "--", *flags]  # fmt: skip
    t0 = time.time()
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if res.returncode != 0:
        raise SystemExit(f"{kind}: {' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-3000:]}\n"
                         f"{res.stderr[-3000:]}")  # fmt: skip
    if kind in ENGINE_FLAGS:
        recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        recs = [r for r in recs if "event" not in r and "step" in r and "step_s" in r]
        summary = json.loads((out / "summary.json").read_text())
        step_s = [r["step_s"] for r in recs]
        tokens = [completion_tokens(r) for r in recs]
        m = {"trainer": kind, "steps": len(recs), "step_s": step_s, "tokens": tokens,
             "train_peak_mem_mb": max(r["train_peak_mem_mb"] for r in recs),
             "peak_mem_mb": max(r["peak_mem_mb"] for r in recs),
             "heldout_before": summary["before"]["eval_acc"], "heldout_after": summary["after"]["eval_acc"],
             "loss_type": "s_grpo preset", "gen_s": [r["gen_s"] for r in recs],
             "rollout_engine": recs[0].get("rollout_engine"),
             "rollout_logp_diff": [r.get("rollout_logp_diff") for r in recs]}  # fmt: skip
    else:
        m = json.loads((out / "worker.json").read_text())
    return {**m, **summarize(m["step_s"], m["tokens"]), "process_wall_s": wall}


def completion_tokens(record: dict) -> int:
    """A bundled step record's completion-token count, from its tokens_per_s x step_s: an integer, which the float
    product misses by a rounding error (32.00000000000001 for 32 tokens)."""
    return round(record["tokens_per_s"] * record["step_s"])


def summarize(step_s: list[float], tokens: list[float]) -> dict:
    """Mean step time and completion tokens per second over the steps after the first (its one-off costs: lazy
    optimizer state, first-call allocations); all steps when there is only one."""
    if len(step_s) != len(tokens) or not step_s:
        raise ValueError(f"step times ({len(step_s)}) and token counts ({len(tokens)}) must pair up, at least one")
    s, t = (step_s[1:], tokens[1:]) if len(step_s) > 1 else (step_s, tokens)
    return {"step_s_mean": statistics.mean(s), "tokens_per_s": sum(t) / sum(s), "tokens_per_step": statistics.mean(t)}


def table(rows: list[dict]) -> str:
    base = next((r for r in rows if r["trainer"] == "trl"), None)
    lines = ["| trainer | loss | steps | step s (mean) | rollout s (mean) | completion tokens / s | vs GRPOTrainer | "
             "training peak MiB | process peak MiB | held-out before -> after |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    names = {"bundled": "bundled `python -m train`, HF generate", "trl": "TRL `GRPOTrainer`",
             "sgrpo": "`SGRPOTrainer` (TRL)", "bundled-vllm-fp32": "bundled `python -m train`, vLLM fp32",
             "bundled-vllm-bf16": "bundled `python -m train`, vLLM bf16",
             "bundled-vllm-bf16-sized": "bundled, vLLM bf16, `--vllm-max-model-len 1024 --vllm-kv-cache-gb 0.1`",
             }  # fmt: skip
    for r in rows:
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        gen = r.get("gen_s")
        gen = f"{statistics.mean(gen[1:] if len(gen) > 1 else gen):.2f}" if gen else "-"
        lines.append(f"| {names[r['trainer']]} | {r['loss_type']} | {r['steps']} | {r['step_s_mean']:.2f} | {gen} | "
                     f"{r['tokens_per_s']:.1f} | {ratio} | {r['train_peak_mem_mb']:.0f} | {r['peak_mem_mb']:.0f} | "
                     f"{r['heldout_before']:.3f} -> {r['heldout_after']:.3f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog=common.prog("bench_trainers"), description=__doc__.split("\n\n")[0])
    p.add_argument("--trainers", default=",".join(DEFAULT_TRAINERS),
                   help=f"comma-separated, from {', '.join(TRAINERS)}")  # fmt: skip
    p.add_argument("--vllm-python", default=sys.executable,
                   help="interpreter of the bundled-vllm-* trainers (a venv with vllm; docs/rollouts.md)")  # fmt: skip
    p.add_argument("--model", type=trainer_value("model"), default="smollm2-135m")
    p.add_argument("--steps", type=int_at_least(1), default=30)
    p.add_argument("--prompts", type=trainer_value("prompts_per_step"), default=4)
    p.add_argument("--group-size", type=trainer_value("group_size"), default=8)
    p.add_argument("--max-new-tokens", type=trainer_value("max_new_tokens"), default=12)
    p.add_argument("--eval-problems", type=trainer_value("eval_problems"), default=100)
    p.add_argument("--threads", type=int_at_least(1), default=os.cpu_count() or 1)
    p.add_argument("--seed", type=trainer_value("seed"), default=0)
    p.add_argument("--mixed-precision", type=trainer_value("mixed_precision"), default="off",
                   help="bf16: every trainer under bf16 autocast (--mixed-precision bf16; TRL: bf16=True)")  # fmt: skip
    where = p.add_mutually_exclusive_group()
    where.add_argument("--publish", action="store_true", help="write benchmarks/results/trainers_cpu.{json,md}")
    where.add_argument("--out", default=str(SCRATCH), help="results folder (trainers.{json,md}); scratch")
    p.add_argument("--worker", choices=("trl", "sgrpo"), help=argparse.SUPPRESS)
    p.add_argument("--worker-result", type=Path, help=argparse.SUPPRESS)
    p.add_argument("flags", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        trl_worker(args.worker, args.flags, args.worker_result)
        return 0
    kinds = [k.strip() for k in args.trainers.split(",") if k.strip()]
    bad = [k for k in kinds if k not in TRAINERS]
    if bad or not kinds:
        p.error(f"--trainers {args.trainers!r}: expected names from {', '.join(TRAINERS)}")
    if twice := sorted({k for k in kinds if kinds.count(k) > 1}):  # the second run's row would replace the first's
        p.error(f"--trainers {args.trainers!r}: {', '.join(twice)} named twice; name each trainer once")
    if args.flags:  # the TRL workers' job flags: only with --worker
        p.error(f"unrecognized arguments: {shlex.join(args.flags)}")
    # before the first trainer runs: what a later one needs (a refusal after an hour of the others loses their results)
    missing = [m for m in TRL_MODULES if importlib.util.find_spec(m) is None]
    trl_kinds = [k for k in kinds if k not in ENGINE_FLAGS]
    if trl_kinds and missing:
        p.error(f"--trainers {args.trainers}: {', '.join(trl_kinds)} need {' and '.join(missing)}, not importable by "
                f"{sys.executable}; install the trl extra, or leave {', '.join(trl_kinds)} out")  # fmt: skip
    if any(k.startswith("bundled-vllm") for k in kinds) and (err := vllm_python_error(args.vllm_python)):
        p.error(err)
    out_dir, stem = (RESULTS, "trainers_cpu") if args.publish else (Path(args.out), "trainers")
    if args.publish:
        check_out(p, "--publish", RESULTS, "dir")
    else:
        check_out(p, "--out", args.out, "dir")  # as typed: "" is refused as empty, not taken for "."
    work = SCRATCH / "trainers_work"
    rows = []
    for kind in kinds:
        print(f"{kind}: {args.steps} steps ...", flush=True)
        rows.append(run_trainer(kind, args, work))
        r = rows[-1]
        print(f"  {r['step_s_mean']:.2f} s/step, {r['tokens_per_s']:.1f} tokens/s, {r['train_peak_mem_mb']:.0f} MiB",
              flush=True)  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    job = {k: getattr(args, k) for k in ("model", "steps", "prompts", "group_size", "max_new_tokens", "eval_problems",
                                         "threads", "seed", "mixed_precision")}  # fmt: skip
    meta = {"job": job, "cpu": cpu_name(), "git": git_sha(), "versions": versions(), "load1": os.getloadavg()[0],
            "command": common.command_line("bench_trainers", argv)}  # fmt: skip
    (out_dir / f"{stem}.json").write_text(json.dumps({**meta, "trainers": rows}, indent=2) + "\n")
    md = (f"# Trainers end to end on CPU\n\n`{meta['command']}` on {meta['cpu']} (git {meta['git']}); job: "
          f"{json.dumps(job)}\n\n{table(rows)}\n")  # fmt: skip
    (out_dir / f"{stem}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
