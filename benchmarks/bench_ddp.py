"""The cost of data parallelism on one machine: the bundled trainer as 1 process against `torchrun --nproc_per_node N`
on the same global batch (prompts x G per step), same total threads. Reports the mean step time (steps after the
first) and rank 0's peak memory per process; writes runs/bench/ddp/ddp.md (or benchmarks/results/ddp_cpu.md with
--publish), beside the two jobs' run folders runs/bench/ddp/np1 and runs/bench/ddp/npN.

    python -m benchmarks.bench_ddp --nproc 2 --steps 4
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common
from benchmarks.bench_trainers import trainer_value
from benchmarks.common import RESULTS, check_out, cpu_name, git_sha, int_at_least, scratch_dir, trainer_module, versions

REPO = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(nproc: int, args: argparse.Namespace, out: Path) -> dict:
    threads = max(1, args.cores // nproc)
    train = ["--model", args.model, "--output-dir", str(out), "--overwrite", "--max-steps", str(args.steps),
             "--prompts-per-step", str(args.prompts), "--group-size", str(args.group_size), "--eval-problems",
             str(args.eval_problems), "--eval-k", "0", "--kl-every", "0", "--save-every", "0", "--progress", "false",
             "--threads", str(threads)]  # fmt: skip
    if nproc == 1:
        cmd = [sys.executable, "-m", trainer_module(), *train]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
               "127.0.0.1", "--master_port", str(_port()), "-m", trainer_module(), *train]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    t0 = time.time()
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "event" not in r]
    timed = steps[1:] if len(steps) > 1 else steps
    return {
        "processes": nproc,
        "threads_each": threads,
        "completions_per_step": steps[0]["completions"],
        "step_s_mean": statistics.mean(r["step_s"] for r in timed),
        "step_s_values": [round(r["step_s"], 2) for r in timed],
        "gen_s_mean": statistics.mean(r["gen_s"] for r in timed),
        "peak_mem_mb_rank0": max(r["peak_mem_mb"] for r in steps),
        "train_peak_mem_mb_rank0": max(r["train_peak_mem_mb"] for r in steps),
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog=common.prog("bench_ddp"), description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int_at_least(2), default=2,
                   help="processes of the data-parallel job (torchrun), compared against 1 process")
    p.add_argument("--steps", type=int_at_least(1), default=4)
    p.add_argument("--model", type=trainer_value("model"), default="smollm2-135m")
    p.add_argument("--prompts", type=trainer_value("prompts_per_step"), default=4)
    p.add_argument("--group-size", type=trainer_value("group_size"), default=8)
    p.add_argument("--eval-problems", type=trainer_value("eval_problems"), default=8)
    p.add_argument("--cores", type=int_at_least(1), default=None,
                   help="threads shared by the processes [default: the machine's cores, down to a multiple of --nproc]")
    p.add_argument("--publish", action="store_true", help="write benchmarks/results/ddp_cpu.md")
    args = p.parse_args(argv)
    if args.cores is None:
        n = os.cpu_count() or 1
        args.cores = n - n % args.nproc if n >= args.nproc else n
    if args.nproc > args.cores:
        p.error(f"--nproc {args.nproc} exceeds --cores {args.cores}: the processes share the cores, at least one "
                f"each (same total threads as the single process)")  # fmt: skip
    if args.cores % args.nproc:  # the split would leave cores idle: not the same total threads as the one process
        p.error(f"--cores {args.cores} does not split evenly over --nproc {args.nproc} ({args.cores // args.nproc} "
                f"threads each would leave {args.cores % args.nproc} idle, against the single process's "
                f"{args.cores}); choose --cores a multiple of --nproc")  # fmt: skip
    if args.prompts % args.nproc:
        p.error(f"--prompts {args.prompts} must be a multiple of --nproc {args.nproc} (whole groups per process)")
    work = scratch_dir() / "ddp"
    dest = RESULTS / "ddp_cpu.md" if args.publish else work / "ddp.md"
    check_out(p, "--publish" if args.publish else "the report", dest, "file")  # before any job runs
    rows = [run_job(n, args, work / f"np{n}") for n in (1, args.nproc)]
    one, many = rows
    lines = [
        f"# Data parallel on one CPU machine: 1 process vs {args.nproc} (gloo)",
        "",
        f"`{common.command_line('bench_ddp', argv)}` at "
        f"{git_sha()}; {cpu_name()}, {args.cores} cores; {versions()}. Same global batch: {args.prompts} prompts x "
        f"G={args.group_size} per step; the threads split between the processes. Step time: mean over steps 2.."
        f"{args.steps} (rollout, loss, backward, gradient all-reduce, optimizer).",
        "",
        "| processes | threads each | completions / step | step s (mean) | generation s | peak RSS rank 0 (MiB) | "
        "training peak rank 0 (MiB) | whole job s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['processes']} | {r['threads_each']} | {r['completions_per_step']} | {r['step_s_mean']:.2f} "
            f"({r['step_s_values']}) | {r['gen_s_mean']:.2f} | {r['peak_mem_mb_rank0']:.0f} | "
            f"{r['train_peak_mem_mb_rank0']:.0f} | {r['wall_s']:.0f} |"
        )
    lines += ["", f"{args.nproc} processes vs 1: step time x{many['step_s_mean'] / one['step_s_mean']:.2f}, "
              f"peak memory per process x{many['peak_mem_mb_rank0'] / one['peak_mem_mb_rank0']:.2f}."]  # fmt: skip
    text = "\n".join(lines) + "\n"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)
    print(text)
    print(f"written: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
