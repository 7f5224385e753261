"""Ahead-of-time compilation of every Triton kernel for real GPUs, without a GPU.

The interpreter (TRITON_INTERPRET=1) checks the kernels' numerics but is far more lenient than the compiler (dtype
mixing in tl.dot, layouts, shared-memory budgets). Here each kernel is lowered through TTIR -> TTGIR -> LLVM -> PTX ->
cubin (triton's bundled ptxas) for Hopper (sm_90, every autotune configuration) and Ampere (sm_80, the default
configurations), in bf16, fp16 and fp32, and the cubin's resource usage is checked (shared memory within the
architecture's limit; register spills reported). Runs in a subprocess because TRITON_INTERPRET=1 replaces
`triton.jit` functions by interpreted ones.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

_UNIT_STRIDES = {"stride_hd", "stride_wd", "stride_b", "stride_gb", "stride_xv", "stride_ov"}
_NOT_ALIGNED = {"ignore_index"}
SMEM_LIMIT = {90: 232448, 80: 166912}  # bytes of dynamic shared memory per block (H100, A100)


def _specs(arch: int, full: bool):
    """(name, kernel, arg types, constexprs, num_warps, num_stages) for every kernel and configuration to compile."""
    from sgrpo_kernels.backends.triton_backend import backward, configs, forward, logits

    hopper = arch >= 90
    dtypes = ["bf16", "fp16", "fp32"] if full else ["bf16", "fp32"]
    out = []

    def add(name, fn, types, consts, cfg):
        meta = dict(cfg.kwargs)
        out.append((name, fn, types, {**consts, **meta}, cfg.num_warps, cfg.num_stages))

    for dt in dtypes:
        mm = dict(h_ptr=f"*{dt}", w_ptr=f"*{dt}", b_ptr=f"*{dt}", t_ptr="*i64", inv_temp="fp32", cap_in="fp32",
                  cap_out="fp32", idx_ptr="*i32", count_ptr="*i32", dz_ptr=f"*{dt}", gw_ptr=f"*{dt}", gb_ptr=f"*{dt}")
        f32 = dt == "fp32"
        tiles = configs.tile_configs(hopper, fp32=f32)
        for i, cfg in enumerate(tiles if full or dt == "bf16" else tiles[:1]):
            for split in (False, True):
                for cap in (False, True) if i == 0 else (False,):  # the softcap head: first config of each dtype
                    add(f"fwd-{dt}-{i}-split{int(split)}{'-softcap' * cap}", forward._linear_logprobs_fwd_kernel, mm,
                        dict(HAS_BIAS=True, SOFTCAP=cap, WITH_ENTROPY=True, WITH_STATS=True, SPLIT=split,
                             TRUNCATE=False, DOT_PRECISION="ieee"), cfg)
        # the sampler's support (top-k / top-p / min-p): its own candidate list (configs.tile_configs(truncate=True))
        tiles = configs.tile_configs(hopper, fp32=f32, truncate=True)
        for i, cfg in enumerate(tiles if full or dt == "bf16" else tiles[:1]):
            for split in (False, True):
                for cap in (False, True) if i == 0 else (False,):
                    name = f"fwd-{dt}-{i}-split{int(split)}{'-softcap' * cap}-truncate"
                    add(name, forward._linear_logprobs_fwd_kernel, mm,
                        dict(HAS_BIAS=True, SOFTCAP=cap, WITH_ENTROPY=True, WITH_STATS=True, SPLIT=split,
                             TRUNCATE=True, DOT_PRECISION="ieee"), cfg)  # fmt: skip
        for cap in (False, True):
            tiles = configs.tile_configs(hopper, epilogue_heavy=True, fp32=f32, softcap=cap)
            for i, cfg in enumerate(tiles if full or dt == "bf16" else tiles[:1]):
                for trunc in (False, True) if i == 0 else (False,):
                    add(f"dz-{dt}-{i}{'-softcap' * cap}{'-truncate' * trunc}", backward._linear_logprobs_bwd_dz_kernel,
                        mm, dict(HAS_BIAS=True, SOFTCAP=cap, HAS_GE=True, TRUNCATE=trunc, DOT_PRECISION="ieee"),
                        cfg)  # fmt: skip
        dh = configs.gemm_configs(hopper, "BLOCK_M", "BLOCK_D", "BLOCK_K", f32)
        for i, cfg in enumerate(dh if full or dt == "bf16" else dh[:1]):
            add(f"dh-{dt}-{i}", backward._linear_logprobs_bwd_dh_kernel, mm, dict(DOT_PRECISION="ieee"), cfg)
        dw = configs.gemm_configs(hopper, "BLOCK_V", "BLOCK_D", "BLOCK_K", f32)
        for i, cfg in enumerate(dw if full or dt == "bf16" else dw[:1]):
            add(f"dw-{dt}-{i}", backward._linear_logprobs_bwd_dw_kernel, mm, dict(HAS_BIAS=True, DOT_PRECISION="ieee"),
                cfg)
        lg = dict(x_ptr=f"*{dt}", out_ptr=f"*{dt}", t_ptr="*i64", inv_temp="fp32", temp="fp32")
        for trunc in (False, True):
            for i, cfg in enumerate(configs.logits_fwd_configs()):
                add(f"logits-fwd-{dt}-{i}{'-truncate' * trunc}", logits._logprobs_from_logits_fwd_kernel, lg,
                    dict(WITH_ENTROPY=True, WITH_STATS=True, TRUNCATE=trunc), cfg)
            bw = configs.logits_bwd_config()
            add(f"logits-bwd-{dt}{'-truncate' * trunc}", logits._logprobs_from_logits_bwd_kernel, lg,
                dict(HAS_GE=True, TRUNCATE=trunc),
                triton.Config({k: v for k, v in bw.items() if k.startswith("BLOCK")}, num_warps=bw["num_warps"]))
    add("merge", forward._linear_logprobs_merge_kernel, dict(t_ptr="*i64"), dict(WITH_ENTROPY=True, WITH_STATS=True),
        triton.Config(dict(BLOCK=128), num_warps=4, num_stages=1))
    add("compact", backward._compact_rows_kernel, dict(keep_ptr="*i32", rank_ptr="*i32", idx_ptr="*i32"), {},
        triton.Config(dict(BLOCK=1024), num_warps=4, num_stages=1))
    return out


def _resource_usage(cubin: bytes) -> dict:
    from triton.backends.nvidia import compiler as nv

    tool = Path(nv.__file__).parent / "bin" / "cuobjdump"
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"sgrpo_{os.getpid()}.cubin"
    path.write_bytes(cubin)
    try:
        text = subprocess.run([str(tool), "--dump-resource-usage", str(path)], capture_output=True, text=True).stdout
    finally:
        path.unlink(missing_ok=True)
    regs = re.search(r"REG:(\d+)", text)
    spill = re.search(r"STACK:(\d+)", text)
    return dict(regs=int(regs.group(1)) if regs else -1, stack=int(spill.group(1)) if spill else -1)


def compile_all(arch: int, full: bool) -> list[dict]:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    rows = []
    for name, fn, types, consts, warps, stages in _specs(arch, full):
        # What the JIT specializes at a real launch on contiguous tensors at the benchmark shapes: unit strides become
        # constants, pointers and the other sizes/strides are known multiples of 16 (vectorized loads).
        consts = {**{a: 1 for a in fn.arg_names if a in _UNIT_STRIDES}, **consts}
        missing = [p.name for p in fn.params if p.is_constexpr and p.name not in consts]
        if missing:  # else compiled as a runtime i32: a branch kept that no real launch has (spills, no MMA)
            raise ValueError(f"{name}: constexpr(s) {missing} not given")
        sig = {a: ("constexpr" if a in consts else types.get(a, "*fp32" if a.endswith("_ptr") else "i32"))
               for a in fn.arg_names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
                 if sig[a] != "constexpr" and sig[a] != "fp32" and a not in _NOT_ALIGNED}
        src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
        k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps, num_stages=stages))
        ptx = k.asm["ptx"]
        rows.append(dict(name=name, arch=arch, shared=k.metadata.shared, wgmma="wgmma" in ptx,
                         mma="mma.sync" in ptx, **_resource_usage(k.asm["cubin"])))
    return rows


def _run(arch: int, full: bool) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, __file__, str(arch), "1" if full else "0"], capture_output=True, text=True,
                          env=env, cwd=repo, timeout=1800)
    if proc.returncode != 0:
        raise AssertionError(proc.stderr[-6000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch", [90, 80])
def test_kernels_compile_for_gpu(arch):
    """Every kernel lowers to a cubin; bf16/fp16 tl.dot becomes tensor-core MMA; shared memory fits; no spills."""
    full = os.environ.get("SGRPO_FULL_COMPILE_CHECK") == "1"
    rows = _run(arch, full)
    assert rows
    for r in rows:
        parts = r["name"].split("-")
        dtype = next((p for p in parts if p in ("bf16", "fp16", "fp32")), None)
        assert r["shared"] <= SMEM_LIMIT[arch], r
        # no register spills on the bf16/fp16 fast paths; the fp32 ("ieee", FMA) correctness path may spill a little
        assert r["stack"] <= (64 if dtype == "fp32" else 0), r
        if parts[0] in ("fwd", "dz", "dh", "dw") and dtype != "fp32":
            assert r["wgmma"] if arch >= 90 else r["mma"], r  # fp32 uses "ieee" (FMA), never TF32


if __name__ == "__main__":
    print(json.dumps(compile_all(int(sys.argv[1]), sys.argv[2] == "1")))
