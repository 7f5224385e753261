"""Kernel configurations and the launch: where the kernels run (GPU or interpreter), the autotune candidates per
architecture and dtype, the interpreter's tile sizes, the SGRPO_TRITON_AUTOTUNE switch and `launch`, which runs a
kernel autotuned, with a fixed config, or with the interpreter's config."""

from __future__ import annotations

import functools
import os

import torch
import triton

from sgrpo_kernels.backends.contract import env_flag

from .backward import _linear_logprobs_bwd_dh_kernel, _linear_logprobs_bwd_dw_kernel, _linear_logprobs_bwd_dz_kernel
from .forward import _linear_logprobs_fwd_kernel
from .logits import _logprobs_from_logits_fwd_kernel

# TRITON_INTERPRET=1: the kernels run on CPU tensors in triton's interpreter. Read once, at import: `@triton.jit` also
# decides at decoration time whether a kernel is compiled or interpreted.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def on_gpu(t: torch.Tensor) -> bool:
    """True when the kernels are compiled for a GPU (autotuning); False under the interpreter."""
    return t.device.type == "cuda" and not INTERPRET


def _is_hopper(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 9


@functools.cache
def num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


# Interpreter: one small config each (numpy runs a program per grid point; few, larger tiles are faster there).
INTERP_TILE = dict(BLOCK_M=16, BLOCK_V=32, BLOCK_D=16)
INTERP_GEMM_DH = dict(BLOCK_M=16, BLOCK_D=32, BLOCK_K=32)
INTERP_GEMM_DW = dict(BLOCK_V=32, BLOCK_D=32, BLOCK_K=16)
INTERP_LOGITS = dict(BLOCK_M=16, BLOCK_V=64)

# Nominal BLOCK_M used to decide the vocab split (the autotuned BLOCK_M may differ; it only sizes grid axis 0).
GPU_FWD_BLOCK_M = 128
SPLIT_ALIGN = 256  # vocab span of a split: a multiple of every BLOCK_V candidate
CHUNK_ALIGN = 256  # backward vocab chunk: a multiple of every BLOCK_V / BLOCK_K candidate


def _cfg(num_warps: int, num_stages: int, **meta) -> triton.Config:
    return triton.Config(meta, num_warps=num_warps, num_stages=num_stages)


def tile_configs(hopper: bool, epilogue_heavy: bool = False, fp32: bool = False, softcap: bool = False,
                 truncate: bool = False) -> list:  # fmt: skip
    """Forward (and, with epilogue_heavy, the dZ kernel: its 128x256 tile spills registers on sm_90). The dZ kernel
    with a softcap carries one more tile (the cap's slope): every bf16/fp16 config below spills there (8-16 bytes on
    sm_90), so it gets half-height tiles per warp. The forward over the sampler's support (`truncate`: a threshold
    and a target compare per element) spills at 128x256 on sm_90 too (96-120 bytes), so it leaves that tile out."""
    if softcap and epilogue_heavy and not fp32:
        if hopper:
            return [_cfg(8, 4, BLOCK_M=64, BLOCK_V=128, BLOCK_D=64), _cfg(4, 4, BLOCK_M=64, BLOCK_V=64, BLOCK_D=64),
                    _cfg(8, 3, BLOCK_M=128, BLOCK_V=64, BLOCK_D=128)]
        return [_cfg(4, 3, BLOCK_M=64, BLOCK_V=64, BLOCK_D=32), _cfg(8, 3, BLOCK_M=64, BLOCK_V=128, BLOCK_D=32)]
    if fp32:  # "ieee" fp32 dot products run on FMA units with operands in registers: small tiles, no spills
        return [_cfg(4, 2, BLOCK_M=64, BLOCK_V=64, BLOCK_D=32), _cfg(8, 2, BLOCK_M=128, BLOCK_V=64, BLOCK_D=32)]
    if hopper:  # H100/H200: 228 KB shared memory, wgmma; no register spills at these sizes (test_triton_compile)
        wide = [] if epilogue_heavy or truncate else [_cfg(8, 3, BLOCK_M=128, BLOCK_V=256, BLOCK_D=64)]
        return wide + [
            _cfg(8, 4, BLOCK_M=128, BLOCK_V=128, BLOCK_D=64),
            _cfg(8, 3, BLOCK_M=128, BLOCK_V=128, BLOCK_D=128),
            _cfg(4, 4, BLOCK_M=64, BLOCK_V=128, BLOCK_D=64),
        ]
    return [  # Ampere/Ada and older: a sane default that fits ~100 KB of shared memory
        _cfg(4, 3, BLOCK_M=64, BLOCK_V=128, BLOCK_D=32),
        _cfg(8, 3, BLOCK_M=128, BLOCK_V=128, BLOCK_D=32),
    ]


def gemm_configs(hopper: bool, m: str, n: str, k: str, fp32: bool = False) -> list:
    """grad_h (m = BLOCK_M) and grad_W (m = BLOCK_V) products. grad_h's read-modify-write epilogue spills at 128x256
    and at 128x128 with 4 warps, so those are grad_W-only."""
    if fp32:
        shapes = [(64, 64, 32, 4, 2), (128, 64, 32, 8, 2)]
    elif hopper:
        shapes = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (64, 128, 64, 4, 4)]
        if m == "BLOCK_V":
            shapes += [(128, 256, 64, 8, 3), (128, 128, 64, 4, 4)]
    else:
        shapes = [(128, 128, 32, 8, 3), (64, 128, 32, 4, 3)]  # 128x128 with 4 warps spills on sm_80
    return [_cfg(w, st, **{m: bm, n: bn, k: bk}) for bm, bn, bk, w, st in shapes]


def logits_fwd_configs() -> list:
    return [_cfg(8, 2, BLOCK_M=1, BLOCK_V=4096), _cfg(4, 2, BLOCK_M=1, BLOCK_V=2048),
            _cfg(8, 2, BLOCK_M=2, BLOCK_V=2048)]


def logits_bwd_config() -> dict:
    """Not autotuned: the kernel may overwrite its own input, so it cannot be re-run for timing."""
    return dict(BLOCK_M=1, BLOCK_V=4096, num_warps=8)


@functools.cache
def _tuned(name: str, hopper: bool, fp32: bool):
    """Autotuned wrappers (CUDA only), built lazily so the interpreter never touches CUDA."""
    if name in ("fwd", "fwd_truncate"):  # two candidate lists (tile_configs), so two autotuners
        return triton.autotune(tile_configs(hopper, fp32=fp32, truncate=name == "fwd_truncate"),
                               key=["D", "V", "HAS_BIAS", "SOFTCAP", "WITH_ENTROPY", "SPLIT"])(
            _linear_logprobs_fwd_kernel)
    if name in ("dz", "dz_softcap"):  # two candidate lists (tile_configs), so two autotuners
        return triton.autotune(tile_configs(hopper, epilogue_heavy=True, fp32=fp32, softcap=name == "dz_softcap"),
                               key=["D", "vc", "HAS_BIAS", "SOFTCAP", "HAS_GE"])(_linear_logprobs_bwd_dz_kernel)
    if name == "dh":  # read-modify-write of the fp32 accumulator: restore it between tuning runs
        return triton.autotune(gemm_configs(hopper, "BLOCK_M", "BLOCK_D", "BLOCK_K", fp32), key=["D", "vc"],
                               restore_value=["gh_ptr"])(_linear_logprobs_bwd_dh_kernel)
    if name == "dw":
        return triton.autotune(gemm_configs(hopper, "BLOCK_V", "BLOCK_D", "BLOCK_K", fp32),
                               key=["D", "vc", "HAS_BIAS"])(_linear_logprobs_bwd_dw_kernel)
    if name == "logits_fwd":
        return triton.autotune(logits_fwd_configs(), key=["V", "WITH_ENTROPY"])(_logprobs_from_logits_fwd_kernel)
    raise KeyError(name)


# Env SGRPO_TRITON_AUTOTUNE=0: every kernel runs its first listed config instead of autotuning. For test suites that
# call the kernels at many small shapes (each new shape would otherwise compile and time every config); timings and
# benchmarks keep autotuning.
ENV_AUTOTUNE = "SGRPO_TRITON_AUTOTUNE"


def autotune_enabled() -> bool:
    return env_flag(ENV_AUTOTUNE, True)


@functools.cache
def fixed_config(name: str, hopper: bool, fp32: bool) -> triton.Config:
    """The config a kernel runs with when autotuning is off: the first of the list _tuned would search."""
    return _tuned(name, hopper, fp32).configs[0]


def launch(name: str, kernel, grid, ref: torch.Tensor, interp_meta: dict, *args, **kwargs) -> None:
    """Autotuned launch on a GPU (a fixed config with SGRPO_TRITON_AUTOTUNE=0); the one interpreter config otherwise.
    `grid(meta)` gets the block sizes."""
    if on_gpu(ref):
        hopper, fp32 = _is_hopper(ref.device), ref.dtype == torch.float32
        if autotune_enabled():
            _tuned(name, hopper, fp32)[grid](*args, **kwargs)
        else:
            cfg = fixed_config(name, hopper, fp32)
            kernel[grid(cfg.kwargs)](*args, **kwargs, **cfg.kwargs, num_warps=cfg.num_warps,
                                     num_stages=cfg.num_stages)
    else:
        kernel[grid(interp_meta)](*args, **kwargs, **interp_meta)
