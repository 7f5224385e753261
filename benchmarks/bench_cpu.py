"""CPU benchmark: the reference path (full logits), the chunked `torch` backend and, when `trl` is installed, TRL's
fused LM head (`trl.kernels.ChunkedLogProbFunction`, TRL's own chunk width) at real LM-head shapes; when `verl` is
installed (run from its venv), verl's fused op (`FusedLinearForPPO`, its default 512-token chunk).

    python -m benchmarks.bench_cpu                       # all shapes -> runs/bench/cpu.{csv,md} (scratch)
    python -m benchmarks.bench_cpu --models qwen2.5-0.5b --tokens 2048 --repeats 3
    python -m benchmarks.bench_cpu --publish             # -> benchmarks/results/cpu.{csv,md} (the committed tables)

A run writes to a scratch location unless asked (--publish, or --out PATH): the committed tables change only on
purpose.

- peak_extra_mb: one call per provider in a fresh subprocess; the peak resident memory during the call (VmHWM, reset
  just before it) minus the resident memory just before it (inputs already allocated), minus the size of the
  gradients the call returns (fwd+bwd). That is "memory beyond inputs and gradients": logits, softmax, autograd
  buffers, tiles. Subtracting the gradients is conservative for the reference path, whose peak comes in the forward,
  before its gradients exist.
- time: median (p20, p80) over --repeats timed calls after --warmup untimed ones; both providers run in one
  subprocess, alternating call by call, so changes in machine load hit both alike.
fwd = forward with grad enabled (what training does before backward); fwd+bwd = forward + backward through both
outputs (random upstream gradients on logp and entropy); fwd+bwd-half0 = the same with the upstream gradients of half
the rows exactly zero (filtered completions, zero-advantage groups: rows the op skips). fp32, all cores.
A number is reported only after the provider's outputs (values and gradient norms) agreed with the reference path's at
the same shape.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from benchmarks import common
from benchmarks.common import (
    RESULTS,
    PeakRSS,
    check_out,
    cpu_name,
    git_sha,
    int_at_least,
    quantiles,
    spawn_worker,
    versions,
    write_tables,
)

ROOT = Path(__file__).resolve().parent.parent  # the repository root: workers run `-m benchmarks.bench_cpu` from here
SCRATCH = "runs/bench/cpu"  # the default output stem, relative to the repository root (runs/ is git-ignored)

MODELS = {"smollm2-135m": (576, 49152), "qwen2.5-0.5b": (896, 151936)}
MODES = ("fwd", "fwd+bwd", "fwd+bwd-half0")
TRL_CHUNK = 32768  # the vocabulary chunk TRL's GRPOTrainer passes (trl 1.16, trl/trainer/utils.py)
VERL_CHUNK = 512  # the token chunk of verl's FusedLinearForPPO (its default; verl 0.9.1)


def providers() -> tuple[str, ...]:
    """reference and torch always; trl when it is installed; verl (its fused op, `verl.utils.experimental.
    torch_functional.FusedLinearForPPO`, plain PyTorch: run from the verl venv) when verl is installed."""
    import importlib.util

    try:
        from trl.kernels import ChunkedLogProbFunction  # noqa: F401
    except ImportError:
        names = ("reference", "torch")
    else:
        names = ("reference", "torch", "trl")
    return names + (("verl",) if importlib.util.find_spec("verl") is not None else ())  # imported when called


PROVIDERS = providers()


def _setup(D: int, V: int, N: int):
    import torch

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(N, D, generator=g).div_(D**0.5).requires_grad_(True)
    weight = torch.randn(V, D, generator=g).mul_(0.16).requires_grad_(True)
    targets = torch.randint(0, V, (N,), generator=g)
    g_logp, g_ent = torch.randn(N, generator=g), torch.randn(N, generator=g)
    return hidden, weight, targets, g_logp, g_ent


def _upstream(mode: str, g_logp, g_ent):
    """The upstream gradients of a mode: fwd+bwd-half0 zeroes every other row (exactly 0: skippable)."""
    if mode != "fwd+bwd-half0":
        return g_logp, g_ent
    keep = (__import__("torch").arange(len(g_logp)) % 2 == 0).to(g_logp.dtype)
    return g_logp * keep, g_ent * keep


def _make_call(provider: str, mode: str, hidden, weight, targets, g_logp, g_ent):
    import torch

    import sgrpo_kernels as sk
    from sgrpo_kernels import reference as ref

    if provider == "trl":
        from trl.kernels import ChunkedLogProbFunction

        def fn(h, w, t):
            out = ChunkedLogProbFunction.apply(h, w, None, t, 1.0, TRL_CHUNK, None, 1.0, ("entropy",))
            return out[0], out[1]
    elif provider == "verl":
        os.environ.setdefault("VERL_USE_EXTERNAL_PLUGINS", "none")  # the op alone, not verl's plugins
        from verl.utils.experimental.torch_functional import FusedLinearForPPO

        op = FusedLinearForPPO(chunk_size=VERL_CHUNK)

        def fn(h, w, t):
            return op(h, w, t, 1.0)
    else:
        fn = ref.linear_logprobs if provider == "reference" else sk.linear_logprobs
    g_logp, g_ent = _upstream(mode, g_logp, g_ent)

    def call():
        hidden.grad = None
        weight.grad = None
        logp, ent = fn(hidden, weight, targets)
        if mode != "fwd":
            torch.autograd.backward((logp, ent), (g_logp, g_ent))
            return logp.detach(), ent.detach(), hidden.grad, weight.grad
        return logp.detach(), ent.detach()

    return call


def _worker_mem(provider: str, D: int, V: int, N: int, mode: str) -> dict:
    """One call in a fresh process: its memory peak and a checksum of its outputs."""
    import torch

    inputs = _setup(D, V, N)
    call = _make_call(provider, mode, *inputs)
    grad_bytes = (N * D + V * D) * 4 if mode != "fwd" else 0
    with PeakRSS() as peak:
        out = call()
    check = {"logp_sum": float(out[0].double().sum()), "ent_sum": float(out[1].double().sum())}
    if mode != "fwd":
        check["gh_norm"] = float(out[2].double().norm())
        check["gw_norm"] = float(out[3].double().norm())
    return {"peak_extra_mb": max(0, peak.extra - grad_bytes) / 2**20, "check": check,
            "threads": torch.get_num_threads()}  # fmt: skip


def _worker_time(D: int, V: int, N: int, mode: str, repeats: int, warmup: int) -> dict:
    """Both providers in one process, alternating call by call, so a change in machine load hits both alike."""
    import time

    inputs = _setup(D, V, N)
    calls = {p: _make_call(p, mode, *inputs) for p in PROVIDERS}
    times: dict[str, list[float]] = {p: [] for p in PROVIDERS}
    for i in range(warmup + repeats):
        for p, call in calls.items():
            t0 = time.perf_counter()
            call()
            dt = (time.perf_counter() - t0) * 1e3
            if i >= warmup:
                times[p].append(dt)
    return times


def _spawn(*args) -> dict:
    return spawn_worker("bench_cpu", ROOT, *args)


def _agree(a: dict, b: dict) -> bool:
    return all(abs(a[k] - b[k]) <= 1e-3 * max(1.0, abs(b[k])) for k in b)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=common.prog("bench_cpu"),
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS), help="LM-head shapes")
    p.add_argument("--tokens", nargs="+", type=int_at_least(1), default=[256, 1024, 2048], help="N, rows per call")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES), help="what is timed")
    p.add_argument("--repeats", type=int_at_least(1), default=3, help="timed calls per provider")
    p.add_argument("--warmup", type=int_at_least(0), default=1, help="untimed calls before them")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", default=SCRATCH, help="output path stem (.csv and .md are written); scratch")
    where.add_argument(
        "--publish",
        action="store_true",
        help="write the committed tables instead: benchmarks/results/cpu.{csv,md}",
    )
    return p


def output_stem(args: argparse.Namespace) -> Path:
    """The committed results with --publish, else --out (default: the scratch location under runs/)."""
    return RESULTS / "cpu" if args.publish else Path(args.out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_worker"]:  # one measurement in a fresh process (_spawn)
        kind, *rest = json.loads(argv[1])
        print(json.dumps(_worker_mem(*rest) if kind == "mem" else _worker_time(*rest)))
        return 0
    ap = build_parser()
    args = ap.parse_args(argv)
    # the output path before any measuring (--out as typed: "" is refused as empty, not taken for ".")
    if args.publish:
        check_out(ap, "--publish", output_stem(args), "stem")
    else:
        check_out(ap, "--out", args.out, "stem")

    rows = []
    configs = [(m, n, mode) for m in args.models for n in args.tokens for mode in args.modes]
    for i, (model, N, mode) in enumerate(configs, 1):
        D, V = MODELS[model]
        print(f"[{i}/{len(configs)}] {model} N={N} {mode}: memory ...", end=" ", flush=True)
        mem = {p: _spawn("mem", p, D, V, N, mode) for p in PROVIDERS}
        for p in PROVIDERS[1:]:
            if not _agree(mem[p]["check"], mem["reference"]["check"]):
                raise SystemExit(f"{p} disagrees with the reference at {model} N={N} {mode}: {mem[p]['check']} vs "
                                 f"{mem['reference']['check']}")  # fmt: skip
        print("time ...", end=" ", flush=True)
        times = _spawn("time", D, V, N, mode, args.repeats, args.warmup)
        stats = {p: quantiles(times[p]) for p in PROVIDERS}
        print(", ".join(f"{p} {stats[p][0]:.0f} ms / {mem[p]['peak_extra_mb']:.0f} MB" for p in PROVIDERS), flush=True)
        for p in PROVIDERS:
            med, p20, p80 = stats[p]
            rows.append({
                "device": cpu_name(), "threads": mem[p]["threads"], "provider": p, "model": model, "mode": mode,
                "N": N, "D": D, "V": V, "dtype": "fp32", "ms_median": round(med, 1), "ms_p20": round(p20, 1),
                "ms_p80": round(p80, 1), "peak_extra_mb": round(mem[p]["peak_extra_mb"], 1),
                "time_vs_ref": round(med / stats["reference"][0], 3),
                "time_vs_trl": round(med / stats["trl"][0], 3) if "trl" in stats else None,
                "mem_vs_ref": round(mem[p]["peak_extra_mb"] / max(mem["reference"]["peak_extra_mb"], 1e-9), 4),
                "versions": versions(), "git_sha": git_sha(),
            })  # fmt: skip

    cols = ["model", "N", "mode", "provider", "ms_median", "ms_p20", "ms_p80", "peak_extra_mb", "time_vs_ref",
            "mem_vs_ref"] + (["time_vs_trl"] if "trl" in PROVIDERS else [])  # fmt: skip
    header = (f"CPU benchmark: {rows[0]['device']}, {rows[0]['threads']} threads, {rows[0]['versions']}, "
              f"git {rows[0]['git_sha']}, fp32, repeats={args.repeats}.\n"
              f"Command: {common.command_line('bench_cpu', argv)}\n\n")  # fmt: skip
    write_tables(output_stem(args), rows, cols, header)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
