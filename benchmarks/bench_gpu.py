"""CUDA benchmark of the fused LM-head log-prob + entropy op against the reference path and peers.

    python -m benchmarks.bench_gpu                              # both shapes, all modes, every importable provider
    python -m benchmarks.bench_gpu --shapes 8192x4096x131072 --providers triton,reference --repeats 20

(from the repository root: the benchmarks are a package, run as modules).

Providers: `reference` (sgrpo_kernels.reference: full bf16 logits + autograd, the baseline), `torch` (chunked backend),
`triton` (this package's kernels), and when importable:
- `liger_flce`: Liger-Kernel fused linear cross entropy, reduction="none": log-prob only, no entropy;
- `liger_scaled_ce`: Liger's fused linear scaled CE, log-prob and entropy with gradients; CuTe DSL kernels on sm_90
  only (they need the `nvidia-cutlass-dsl` package), a 512-token torch fallback elsewhere;
- `cce`: Apple cut-cross-entropy, reduction="none": log-prob only;
- `trl`: TRL's fused LM head (`trl.kernels.ChunkedLogProbFunction`, what `GRPOTrainer` runs; log-prob and entropy
  with gradients) at TRL's own vocabulary chunk: cuBLAS tiles folded by Triton kernels on CUDA, by torch ops elsewhere
  (the CPU smoke test).
- `verl`: verl's fused log-prob + entropy (`verl.utils.experimental.torch_functional.FusedLinearForPPO`, what
  `use_fused_kernels` runs with impl_backend torch) at its default 512-token chunk; needs verl (its own venv).
`liger_flce` and `cce` compute less (no entropy) and are listed for orientation.

Modes (the `mode` column): `fwd` = forward-only, no-grad call (old-policy / reference log-probs), tflops = 2MDV/t;
`fwd+bwd` = forward + backward through logp and entropy with random upstream gradients, tflops = 8MDV/t; the
`zero_grad_frac` column gives the fraction of rows whose two upstream gradients are exactly zero (0.5 = half the
rows masked); its tflops still count 8MDV, so skipping those rows shows as higher effective throughput.

peak_mem_gb: peak allocated CUDA memory during one call minus what was allocated just before it (inputs and upstream
gradients), i.e. everything the call allocates, the gradients it returns included; the markdown notes give the size
of those gradients so "memory beyond inputs and gradients" can be read off.
Time: median (p20, p80) of CUDA-event timings over --repeats calls after --warmup calls.
A row is written only when the provider's logp (and, fwd+bwd, grad_hidden) on a sample of rows is within the error
of the same-dtype naive computation of float64 (CONVENTIONS.md); otherwise the provider is reported as failing.
Also measures the bf16 matmul rate of the GPU (8192^3 torch.matmul) as a `cublas_matmul` row.

Writes benchmarks/results/gpu.csv, gpu.md and gpu.png (or --out PREFIX). A `--device cpu` smoke test writes to the
scratch folder runs/bench/ (gpu_smoke.*) unless --out is given: it never replaces the GPU results by default.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.common import (
    IGNORE,
    check_out,
    default_out,
    git_sha,
    int_at_least,
    lm_head_inputs,
    make_call,
    markdown_table,
    parse_shape,
    quantiles,
    versions,
    write_csv,
)
from benchmarks.gpu_report import plot, targets_report

COLUMNS = ["device", "provider", "mode", "M", "D", "V", "dtype", "zero_grad_frac", "ms_median", "ms_p20", "ms_p80",
           "tflops", "peak_mem_gb", "versions", "git_sha"]
SHAPES = ["8192x4096x131072", "16384x2048x248320"]  # M x D x V: Liger's published shape; the large-vocabulary one
# at which TRL measured Cut Cross-Entropy and Liger on an H100 (issue 40)
MODES = [("fwd", 0.0), ("fwd+bwd", 0.0), ("fwd+bwd", 0.5)]
PROVIDERS = ["reference", "torch", "triton", "liger_flce", "liger_scaled_ce", "cce", "trl", "verl"]


# ------------------------------------------------------------------------------------------------- providers


def _peer(provider: str):
    """The peer's callable (hidden, weight, targets) -> (logp, entropy | None), or raise ImportError with the reason."""
    if provider == "liger_flce":
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        def fn(h, w, t):
            out = liger_fused_linear_cross_entropy(h, w, t, ignore_index=IGNORE, reduction="none")
            loss = out[0] if isinstance(out, tuple) else out  # some versions return (loss, z_loss)
            return -loss.float(), None

        return fn
    if provider == "cce":
        from cut_cross_entropy import linear_cross_entropy

        def fn(h, w, t):
            # CCE's Triton kernels pass None pointers, which the Triton interpreter rejects: off CUDA (the CPU smoke
            # test) the adapter runs CCE's torch.compile implementation, same signature and semantics.
            impl = "cce" if h.is_cuda else "torch_compile"
            return -linear_cross_entropy(h, w, t, ignore_index=IGNORE, reduction="none", impl=impl).float(), None

        return fn
    if provider == "liger_scaled_ce":
        # Liger >= 0.8 ships per-token NLL + entropy (with gradient) as an autograd-function-like class; it dispatches
        # to CuTe DSL kernels on sm_90 and to a 512-token torch fallback elsewhere (so off Hopper it is not the fast
        # path). Positional signature: (input, weight, target, temperature, ignore_index, m_tiles_per_cluster,
        # return_entropy) -> (nll, entropy).
        from liger_kernel.ops import LigerFusedLinearScaledCrossEntropyFunction as ScaledCE

        def fn(h, w, t):
            nll, ent = ScaledCE.apply(h, w, t, 1.0, IGNORE, 1, True)
            return -nll.float(), ent.float()

        return fn
    if provider == "trl":
        # (hidden, weight, bias, targets, temperature, chunk_size, softcap, logit_scale, outputs) -> (logp, entropy,
        # 3 outputs not asked for); every target is a vocabulary id here (TRL's op has no ignore_index)
        from trl.kernels import ChunkedLogProbFunction

        from benchmarks.bench_cpu import TRL_CHUNK

        def fn(h, w, t):
            out = ChunkedLogProbFunction.apply(h, w, None, t, 1.0, TRL_CHUNK, None, 1.0, ("entropy",))
            return out[0], out[1]

        return fn
    if provider == "verl":
        # verl's fused log-prob + entropy (`use_fused_kernels`, impl_backend torch): token chunks of full-vocabulary
        # logits, log-prob and entropy with gradients; no ignore_index (every target is a vocabulary id here)
        import os

        os.environ.setdefault("VERL_USE_EXTERNAL_PLUGINS", "none")  # the op alone, not verl's plugins
        from verl.utils.experimental.torch_functional import FusedLinearForPPO

        from benchmarks.bench_cpu import VERL_CHUNK

        op = FusedLinearForPPO(chunk_size=VERL_CHUNK)
        return lambda h, w, t: op(h, w, t, 1.0)
    raise ValueError(provider)


def _provider_fn(provider: str):
    import sgrpo_kernels as sk
    from sgrpo_kernels import reference as ref

    if provider == "reference":
        return lambda h, w, t: ref.linear_logprobs(h, w, t, ignore_index=IGNORE)
    if provider in ("torch", "triton"):
        return lambda h, w, t: sk.linear_logprobs(h, w, t, ignore_index=IGNORE, backend=provider)
    return _peer(provider)


# ------------------------------------------------------------------------------------------------- measurement


class _Timer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn, repeats: int, warmup: int) -> list[float]:
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(repeats):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return times

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


# Relative slack on top of twice the naive same-dtype error (CONVENTIONS.md: tolerances come from the data).
_GATE_TOL = {torch.float32: 1e-4, torch.float16: 1e-3, torch.bfloat16: 5e-3}


def _check(fn, mode, hidden, weight, targets, g_logp, g_ent, n_sample: int = 128) -> tuple[bool, str]:
    """logp (and grad_hidden for fwd+bwd) on sampled rows: |got - fp64| <= 2 |naive same-dtype - fp64| + tol * scale,
    scale = max(1, max |fp64|), tol from _GATE_TOL."""
    from sgrpo_kernels import reference as ref

    out = make_call(fn, mode, hidden, weight, targets, g_logp, g_ent)()
    logp = out[0]
    rows = torch.randperm(hidden.shape[0], device="cpu")[:n_sample].to(hidden.device)
    he = hidden[rows].double().requires_grad_(True)
    lp_e, en_e = ref.linear_logprobs(he, weight.double(), targets[rows], ignore_index=IGNORE, out_dtype=None)
    hn = hidden[rows].detach().requires_grad_(True)
    lp_n, en_n = ref.linear_logprobs(hn, weight, targets[rows], ignore_index=IGNORE)
    pairs = [(logp[rows], lp_n, lp_e.detach())]
    if mode != "fwd":
        has_ent = out[1] is not None
        loss_e = (lp_e * g_logp[rows].double()).sum() + ((en_e * g_ent[rows].double()).sum() if has_ent else 0)
        loss_n = (lp_n * g_logp[rows]).sum() + ((en_n * g_ent[rows]).sum() if has_ent else 0)
        (gh_e,) = torch.autograd.grad(loss_e, he)
        (gh_n,) = torch.autograd.grad(loss_n, hn)
        pairs.append((out[2][rows], gh_n, gh_e))
    tol = _GATE_TOL[hidden.dtype]
    for got, naive, exact in pairs:
        err = (got.double() - exact).abs().max().item()
        err_naive = (naive.double() - exact).abs().max().item()
        bound = 2 * err_naive + tol * max(1.0, exact.abs().max().item())
        if not math.isfinite(err) or err > bound:
            return False, f"error {err:.3g} > bound {bound:.3g}"
    return True, ""


def _peak_extra_gb(call, device: torch.device) -> float:
    if device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out
    return (peak - before) / 2**30


def matmul_rate(device: torch.device, n: int, repeats: int, timer: _Timer) -> tuple[float, list[float]]:
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    times = timer(lambda: a @ b, repeats, 3)
    return 2 * n**3 / (quantiles(times)[0] * 1e-3) / 1e12, times


def _parse_shapes(ap: argparse.ArgumentParser, text: str) -> list[tuple[int, int, int]]:
    shapes = [parse_shape(ap, "--shapes", item) for item in [x.strip() for x in text.split(",") if x.strip()]]
    if not shapes:
        ap.error("--shapes: empty")
    return shapes


def _parse_modes(ap: argparse.ArgumentParser, text: str) -> list[tuple[str, float]]:
    modes = []
    for item in [x.strip() for x in text.split(",") if x.strip()]:
        name, _, frac = item.partition("@")
        try:
            zero = float(frac) if frac else 0.0
        except ValueError:
            zero = -1.0
        if name not in ("fwd", "fwd+bwd") or not 0.0 <= zero < 1.0 or (name == "fwd" and zero):
            ap.error(f"--modes: {item!r} is not fwd, fwd+bwd or fwd+bwd@FRAC with 0 <= FRAC < 1")
        modes.append((name, zero))
    if not modes:
        ap.error("--modes: empty")
    return modes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=common.prog("bench_gpu"), description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated MxDxV")
    ap.add_argument("--providers", default=",".join(PROVIDERS))
    ap.add_argument("--modes", default="fwd,fwd+bwd,fwd+bwd@0.5", help="fwd, fwd+bwd, fwd+bwd@FRAC (zero-grad rows)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--repeats", type=int_at_least(1), default=20, help="timed calls per provider, at least 1")
    ap.add_argument("--warmup", type=int_at_least(0), default=5, help="untimed calls before them")
    ap.add_argument(
        "--out",
        default=None,
        help="output prefix (.csv, .md, .png are appended) [default: benchmarks/results/gpu; with --device cpu, "
        "the scratch runs/bench/gpu_smoke]",
    )
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke test of the script itself at tiny shapes (with TRITON_INTERPRET=1 for triton); "
                         "its times mean nothing")
    args = ap.parse_args(argv)

    shapes, modes = _parse_shapes(ap, args.shapes), _parse_modes(ap, args.modes)
    wanted = [p.strip() for p in args.providers.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in PROVIDERS]
    if unknown or not wanted:
        ap.error(f"--providers: unknown {', '.join(unknown) or '(none given)'}; "
                 f"expected a comma-separated subset of {', '.join(PROVIDERS)}")
    # a CPU smoke test never lands on the committed GPU results unless --out says so
    out_arg = args.out if args.out is not None else default_out("gpu", "gpu_smoke", args.device == "cuda")
    check_out(ap, "--out", out_arg, "stem")
    for suffix in (".csv", ".md", ".png"):
        check_out(ap, "--out", Path(out_arg).with_suffix(suffix), "file")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here, nothing measured (python -m benchmarks.bench_cpu covers CPUs).",
              file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter smoke test)"
    vers, sha = versions(), git_sha()
    timer = _Timer(device)
    rows: list[dict] = []
    notes: list[str] = []

    def row(provider, mode, M, D, V, zero, times, flops, peak):
        med, p20, p80 = quantiles(times)
        rows.append(dict(device=dev_name, provider=provider, mode=mode, M=M, D=D, V=V, dtype=args.dtype,
                         zero_grad_frac=zero, ms_median=round(med, 3), ms_p20=round(p20, 3), ms_p80=round(p80, 3),
                         tflops=round(flops / (med * 1e-3) / 1e12, 1), peak_mem_gb=round(peak, 3), versions=vers,
                         git_sha=sha))
        print(" | ".join(str(rows[-1][c]) for c in COLUMNS[1:13]), flush=True)

    if device.type == "cuda":
        n = 8192
        rate, times = matmul_rate(device, n, args.repeats, timer)
        row("cublas_matmul", "matmul", n, n, n, 0.0, times, 2 * n**3, 0.0)
        notes.append(f"bf16 matmul 8192^3 (torch.matmul): {rate:.0f} TFLOP/s")

    fns = {}
    for p in wanted:
        try:
            fns[p] = _provider_fn(p)
        except Exception as exc:  # a peer that is not installed, or an API that changed
            notes.append(f"{p}: skipped ({type(exc).__name__}: {exc})")
            print(f"{p}: skipped ({exc})", file=sys.stderr)

    for M, D, V in shapes:
        for mode, zero in modes:
            try:
                data = lm_head_inputs(M, D, V, dtype, device, zero)
            except torch.OutOfMemoryError:
                notes.append(f"{M}x{D}x{V}: inputs do not fit")
                continue
            grads_gb = (data[0].numel() + data[1].numel()) * data[0].element_size() / 2**30
            if mode != "fwd":
                notes.append(f"{M}x{D}x{V} {mode}: gradients (hidden + weight) take {grads_gb:.2f} GB of peak_mem_gb")
            for p, fn in fns.items():
                try:
                    ok, why = _check(fn, mode, *data)
                    if not ok:
                        notes.append(f"{p} {M}x{D}x{V} {mode} zero={zero}: NOT REPORTED, failed the check: {why}")
                        print(notes[-1], file=sys.stderr)
                        continue
                    call = make_call(fn, mode, *data)
                    peak = _peak_extra_gb(call, device)
                    times = timer(call, args.repeats, args.warmup)
                except torch.OutOfMemoryError:
                    notes.append(f"{p} {M}x{D}x{V} {mode} zero={zero}: out of memory")
                    print(notes[-1], file=sys.stderr)
                    torch.cuda.empty_cache()
                    continue
                except Exception as exc:  # a peer failing at this shape must not stop the others
                    notes.append(f"{p} {M}x{D}x{V} {mode} zero={zero}: failed ({type(exc).__name__}: {exc})")
                    print(notes[-1], file=sys.stderr)
                    continue
                flops = (2 if mode == "fwd" else 8) * M * D * V
                row(p, mode, M, D, V, zero, times, flops, peak)
            del data
            if device.type == "cuda":
                torch.cuda.empty_cache()

    if not rows:
        print("nothing measured", file=sys.stderr)
        return 1
    out = Path(out_arg)
    write_csv(out.with_suffix(".csv"), [{c: r[c] for c in COLUMNS} for r in rows])
    md = [f"# GPU benchmark: {dev_name}", "", f"{vers}; git {sha}", ""] + targets_report(rows) + [
          markdown_table(rows, [c for c in COLUMNS if c not in ("device", "versions", "git_sha")]), ""]
    md += [f"- {n}" for n in notes]
    plotted = plot(rows, out.with_suffix(".png"), PROVIDERS)
    if plotted:
        md += ["", f"![throughput]({out.with_suffix('.png').name})"]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(f"wrote {out.with_suffix('.csv')}, {out.with_suffix('.md')}" + (", plot" if plotted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
