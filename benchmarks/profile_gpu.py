"""Where the time of one fused LM-head call goes, kernel by kernel (torch.profiler), for tuning the Triton backend.

    python -m benchmarks.profile_gpu                                   # 8192x4096x131072 bf16, triton, fwd+bwd
    python -m benchmarks.profile_gpu --shape 8192x2304x256000 --zero-frac 0.5 --backend triton

Runs --warmup calls, then profiles --repeats calls of forward + backward (or forward only with --mode fwd) and prints
a table of device kernels: calls, total and mean time, share of the profiled time, and for the kernels whose work is
a known product (the linear forward, the backward's dZ / grad_h / grad_W kernels) their TFLOP/s, counting active rows
only for the backward. Writes the table to --out (markdown) as well: benchmarks/results/profile_gpu.md by default.

On CPU (`--device cpu`, with TRITON_INTERPRET=1 for triton) the same table is built from CPU operator self-times: a
smoke test of the script, not a measurement; its table goes to the scratch folder (runs/bench/profile_gpu_smoke.md)
unless --out is given, never into benchmarks/results/ by default.
"""

from __future__ import annotations

import argparse
import sys
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
    versions,
)

# kernel-name fragment -> FLOPs per call as a function of (M_active, D, V); fwd counts all rows
_FLOPS = {
    "_linear_logprobs_fwd_kernel": lambda m, m_act, d, v: 2 * m * d * v,
    "_linear_logprobs_bwd_dz_kernel": lambda m, m_act, d, v: 2 * m_act * d * v,
    "_linear_logprobs_bwd_dh_kernel": lambda m, m_act, d, v: 2 * m_act * d * v,
    "_linear_logprobs_bwd_dw_kernel": lambda m, m_act, d, v: 2 * m_act * d * v,
}


def kernel_table(events, cuda: bool, M: int, M_active: int, D: int, V: int, repeats: int) -> list[dict]:
    """Aggregate profiler events into rows: name, calls (per profiled call), ms per call, share, TFLOP/s."""
    agg: dict[str, list[float]] = {}
    for e in events:
        if cuda:
            t = getattr(e, "device_time_total", None)
            if t is None:  # older torch
                t = e.cuda_time_total
            if getattr(e, "device_type", None) is not None and "CUDA" not in str(e.device_type):
                continue
        else:
            t = e.self_cpu_time_total
        if t <= 0:
            continue
        acc = agg.setdefault(e.key, [0, 0.0])
        acc[0] += e.count
        acc[1] += t / 1e3  # us -> ms
    total = sum(ms for _, ms in agg.values()) or 1.0
    rows = []
    for name, (count, ms) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        per_call = ms / repeats
        tflops = ""
        for frag, f in _FLOPS.items():
            if frag in name and per_call > 0:
                tflops = round(f(M, M_active, D, V) / (per_call * 1e-3) / 1e12, 1)
        rows.append(dict(kernel=name[:90], calls=round(count / repeats, 2), ms_per_call=round(per_call, 3),
                         share=f"{100 * ms / total:.1f}%", tflops=tflops))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=common.prog("profile_gpu"), description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8192x4096x131072", help="MxDxV")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--backend", default="triton", choices=["triton", "torch"])
    ap.add_argument("--mode", default="fwd+bwd", choices=["fwd", "fwd+bwd"])
    ap.add_argument("--zero-frac", type=float, default=0.0, help="fraction of rows with zero upstream gradients")
    ap.add_argument("--repeats", type=int_at_least(1), default=5, help="profiled calls, at least 1")
    ap.add_argument("--warmup", type=int_at_least(0), default=3, help="calls before profiling (autotuning runs here)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: smoke test of the script")
    ap.add_argument(
        "--out",
        default=None,
        help="markdown file to write [default: benchmarks/results/profile_gpu.md; with --device cpu, the scratch "
        "runs/bench/profile_gpu_smoke.md]",
    )
    args = ap.parse_args(argv)
    M, D, V = parse_shape(ap, "--shape", args.shape)
    if not 0.0 <= args.zero_frac < 1.0:
        ap.error(f"--zero-frac: {args.zero_frac} is not in [0, 1)")
    if args.mode == "fwd" and args.zero_frac:
        ap.error("--zero-frac only applies to --mode fwd+bwd")
    # a CPU smoke test never lands on the committed GPU results unless --out says so
    publish = args.device == "cuda"
    out = args.out if args.out is not None else default_out("profile_gpu.md", "profile_gpu_smoke.md", publish)
    check_out(ap, "--out", out, "file")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("profile_gpu: no CUDA device here, nothing profiled.", file=sys.stderr)
        return 2

    import sgrpo_kernels as sk

    dtype = getattr(torch, args.dtype)
    hidden, weight, targets, g_logp, g_ent = lm_head_inputs(M, D, V, dtype, device, args.zero_frac)
    m_active = int(((g_logp != 0) | (g_ent != 0)).sum())

    def fn(h, w, t):
        return sk.linear_logprobs(h, w, t, ignore_index=IGNORE, backend=args.backend)

    call = make_call(fn, args.mode, hidden, weight, targets, g_logp, g_ent)
    for _ in range(args.warmup):
        call()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(args.repeats):
            call()
        if cuda:
            torch.cuda.synchronize()
    rows = kernel_table(prof.key_averages(), cuda, M, m_active, D, V, args.repeats)
    if not rows:
        print("profile_gpu: the profiler recorded no events", file=sys.stderr)
        return 1
    dev_name = torch.cuda.get_device_name(device) if cuda else "cpu (smoke test: operator self-times)"
    head = (f"# Kernel time breakdown: {args.backend}, {args.mode}, M={M} D={D} V={V} {args.dtype}, "
            f"zero_grad_frac={args.zero_frac} ({m_active} active rows)")
    flags = ["--shape", f"{M}x{D}x{V}", "--dtype", args.dtype]
    flags += ["--backend", args.backend, "--mode", args.mode, "--zero-frac", str(args.zero_frac)]
    flags += ["--repeats", str(args.repeats), "--warmup", str(args.warmup)] + ([] if cuda else ["--device", "cpu"])
    command = common.command_line("profile_gpu", flags)
    md = [head, "", f"{dev_name}; {versions()}; git {git_sha()}", "", f"`{command}`", "",
          markdown_table(rows, ["kernel", "calls", "ms_per_call", "share", "tflops"]), ""]
    text = "\n".join(md)
    print(text)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
