"""CPU benchmark of the sampler's support (top_k / top_p / min_p, issue 42) on the Qwen2.5-0.5B LM head: the truncated
op (`linear_logprobs(..., top_k=, top_p=, min_p=)`, torch backend) beside the full-support op (the same call without
them) and beside the naive path (logits, then sort and mask: `reference.linear_logprobs` with the same settings).

    python -m benchmarks.bench_truncated                  # -> runs/bench/truncated.{csv,md} (scratch)
    python -m benchmarks.bench_truncated --publish        # -> benchmarks/results/truncated_cpu.{csv,md}
    python -m benchmarks.bench_truncated --tokens 256 --repeats 1   # a quick look

Two input regimes, because the cost of finding the support depends on the logits: `lm` (each row leans towards a few
tokens by a random amount, so some rows are confident and some broad: median entropy ~3 nats) and `flat` (bench_cpu's
inputs: near-uniform rows, where top_p 0.9 keeps ~130k of the 152k tokens, the search's worst case: a histogram and a
gather pass besides the first one). fwd+bwd through both outputs, fp32, all cores. Every provider of a regime runs in
one process, alternating call by call (machine load hits all alike). Time: median (p20, p80) over --repeats calls.
Memory: each call's peak resident memory (VmHWM, reset just before it) beyond the resident memory just before it and
the gradients it returns. A number is reported only after the provider's logp, entropy and gradients agreed with the
naive path's (reference.linear_logprobs, same settings) on the first 64 rows of the same inputs. The naive path itself
at N = 2048 (`--providers naive...`) needs ~10 GB: run it only where that is free.
"""

from __future__ import annotations

import argparse
import json
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

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = "runs/bench/truncated"
D, V = 896, 151936  # Qwen2.5-0.5B's head
SETTINGS = {  # provider -> sampler settings (full: none)
    "full": {},
    "top_k=50": {"top_k": 50},
    "top_p=0.9": {"top_p": 0.9},
    "min_p=0.05": {"min_p": 0.05},
    "top_k=50,top_p=0.9": {"top_k": 50, "top_p": 0.9},
}
NAIVE = "naive(top_k=50,top_p=0.9)"
REGIMES = {"lm": tuple(SETTINGS) + (NAIVE,), "flat": ("full", "top_k=50", "top_p=0.9")}


def _setup(regime: str, N: int):
    import torch

    g = torch.Generator().manual_seed(0)
    weight = torch.randn(V, D, generator=g).mul_(0.16)
    if regime == "flat":  # bench_cpu's inputs
        hidden = torch.randn(N, D, generator=g).div_(D**0.5)
    else:  # each row leans towards 3 tokens by random amounts: logits ~15 / ~10 / ~6 above a N(0, 1) bulk
        lean = torch.randint(0, V, (N, 3), generator=g)
        amount = torch.rand(N, 3, generator=g) * torch.tensor([0.3, 0.25, 0.2]) + torch.tensor([0.45, 0.3, 0.2])
        hidden = torch.randn(N, D, generator=g) * 0.2 + (amount.unsqueeze(-1) * weight[lean]).sum(1)
    targets = torch.randint(0, V, (N,), generator=g)
    g_logp, g_ent = torch.randn(N, generator=g), torch.randn(N, generator=g)
    return hidden.requires_grad_(True), weight.requires_grad_(True), targets, g_logp, g_ent


def _make_call(provider: str, hidden, weight, targets, g_logp, g_ent):
    import torch

    import sgrpo_kernels as sk
    from sgrpo_kernels import reference as ref

    if provider == NAIVE:

        def fn(h, w, t):
            return ref.linear_logprobs(h, w, t, **SETTINGS["top_k=50,top_p=0.9"])
    else:

        def fn(h, w, t):
            return sk.linear_logprobs(h, w, t, backend="torch", **SETTINGS[provider])

    def call():
        hidden.grad = None
        weight.grad = None
        logp, ent = fn(hidden, weight, targets)
        torch.autograd.backward((logp, ent), (g_logp, g_ent))
        return logp.detach(), ent.detach(), hidden.grad, weight.grad

    return call


def _gate(provider: str, inputs, rows: int = 64) -> None:
    """Before timing: the provider's outputs and gradients on the first `rows` rows agree with the naive path's
    (reference.linear_logprobs with the same settings, fp32, at a size where it fits in memory)."""
    import torch

    from sgrpo_kernels import reference as ref

    hidden, weight, targets, g_logp, g_ent = inputs
    h = hidden[:rows].detach().requires_grad_(True)
    got = _make_call(provider, h, weight, targets[:rows], g_logp[:rows], g_ent[:rows])()
    gw_got = got[3].clone()
    weight.grad = None
    logp, ent = ref.linear_logprobs(h, weight, targets[:rows], **SETTINGS.get(provider, SETTINGS["top_k=50,top_p=0.9"]))
    gh, gw = torch.autograd.grad((logp * g_logp[:rows]).sum() + (ent * g_ent[:rows]).sum(), [h, weight])
    for name, a, e in zip(("logp", "entropy", "grad_hidden", "grad_weight"), (*got[:3], gw_got), (logp, ent, gh, gw)):
        rel = float((a - e).norm() / e.norm().clamp(min=1e-30))  # fp32 against fp32: the naive path's own error too
        if not rel <= 1e-4:
            raise SystemExit(f"{provider}: {name} disagrees with the naive path (relative error {rel:.3g})")


def _worker(regime: str, N: int, providers: list[str], repeats: int, warmup: int) -> dict:
    """Every provider in one process, alternating call by call (a change in machine load hits all alike): the time of
    each call, and its peak resident memory (VmHWM, reset before it) beyond the memory before it and the gradients."""
    import time

    import torch

    inputs = _setup(regime, N)
    for p in providers:
        _gate(p, inputs)
    calls = {p: _make_call(p, *inputs) for p in providers}
    times: dict[str, list[float]] = {p: [] for p in calls}
    mem: dict[str, float] = {p: 0.0 for p in calls}
    for i in range(warmup + repeats):
        for p, call in calls.items():
            inputs[0].grad = inputs[1].grad = None
            with PeakRSS() as peak:
                t0 = time.perf_counter()
                call()
                dt = (time.perf_counter() - t0) * 1e3
            extra = peak.extra - (N * D + V * D) * 4
            if i >= warmup:
                times[p].append(dt)
                mem[p] = max(mem[p], extra / 2**20)
    return {"times": times, "mem": mem, "threads": torch.get_num_threads()}


def _spawn(*args) -> dict:
    return spawn_worker("bench_truncated", ROOT, *args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=common.prog("bench_truncated"),
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--tokens", type=int_at_least(1), default=2048, help="N, rows per call")
    p.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES), help="input regimes")
    p.add_argument("--providers", nargs="+", choices=[*SETTINGS, NAIVE], help="a subset of each regime's providers")
    p.add_argument("--repeats", type=int_at_least(1), default=2, help="timed calls per provider")
    p.add_argument("--warmup", type=int_at_least(0), default=0, help="untimed calls before them")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", default=SCRATCH, help="output path stem (.csv and .md are written); scratch")
    where.add_argument("--publish", action="store_true", help="write benchmarks/results/truncated_cpu.{csv,md}")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_worker"]:
        print(json.dumps(_worker(*json.loads(argv[1]))))
        return 0
    ap = build_parser()
    args = ap.parse_args(argv)
    for provider in args.providers or []:  # a provider a chosen regime lacks would be left out of it silently
        lacking = [r for r in args.regimes if provider not in REGIMES[r]]
        if lacking:
            ap.error(f"--providers {provider}: regime {', '.join(lacking)} has no such provider (it has "
                     f"{', '.join(REGIMES[lacking[0]])}); drop it, or choose --regimes "
                     f"{' '.join(r for r in REGIMES if provider in REGIMES[r])}")  # fmt: skip
    # the output path before any measuring (--out as typed: "" is refused as empty, not taken for ".")
    if args.publish:
        check_out(ap, "--publish", RESULTS / "truncated_cpu", "stem")
    else:
        check_out(ap, "--out", args.out, "stem")
    rows, N = [], args.tokens
    for regime in args.regimes:
        wanted = args.providers or [p for p in REGIMES[regime] if p != NAIVE]  # naive: on request (N x V memory)
        names = [p for p in REGIMES[regime] if p in wanted or p == "full"]
        print(f"{regime} N={N}: {', '.join(names)} ...", end=" ", flush=True)
        res = _spawn(regime, N, names, args.repeats, args.warmup)
        stats, mem = {p: quantiles(res["times"][p]) for p in names}, res["mem"]
        print(", ".join(f"{p} {stats[p][0]:.0f} ms / {mem[p]:.0f} MB" for p in names), flush=True)
        for p in names:
            med, p20, p80 = stats[p]
            rows.append({
                "device": cpu_name(), "threads": res["threads"], "regime": regime, "provider": p, "N": N, "D": D,
                "V": V, "dtype": "fp32", "mode": "fwd+bwd", "ms_median": round(med, 1), "ms_p20": round(p20, 1),
                "ms_p80": round(p80, 1), "peak_extra_mb": round(mem[p], 1),
                "time_vs_full": round(med / stats["full"][0], 3),
                "mem_vs_full": round(mem[p] / max(mem["full"], 1e-9), 3),
                "versions": versions(), "git_sha": git_sha(),
            })  # fmt: skip
    cols = ["regime", "provider", "N", "ms_median", "ms_p20", "ms_p80", "peak_extra_mb", "time_vs_full", "mem_vs_full"]
    head = (f"Sampler-support benchmark: {rows[0]['device']}, {rows[0]['threads']} threads, {rows[0]['versions']}, "
            f"git {rows[0]['git_sha']}, fp32, Qwen2.5-0.5B head (D={D}, V={V}), fwd+bwd, repeats={args.repeats}.\n"
            f"Command: {common.command_line('bench_truncated', argv)}\n\n")  # fmt: skip
    write_tables(RESULTS / "truncated_cpu" if args.publish else Path(args.out), rows, cols, head)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
