"""The AscendC kernel sources (csrc/ascend) run on the CPU through our emulation header, against float64.

The same .cpp files that the CANN toolchain compiles are built with g++ -DSGRPO_EMU -I csrc/emu (a test double of the
AscendC API subset they use; see csrc/emu/kernel_operator.h for what it checks and what it cannot), loaded with ctypes
and driven on CPU tensors. Outputs are poisoned with NaN first so an unwritten row fails.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from emu_loader import emu_module

from sgrpo_kernels.backends.npu_backend import FINALIZE, HAS_PREV, STATE_FLOATS, WRITE_ENTROPY, WRITE_STATE, WRITE_STATS

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")

IGNORE = -100
TINY = dict(ub_budget=40 * 1024, max_tile=256)  # many UB tiles (and tails) on small shapes
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="session")
def emu_lib():
    emu = emu_module()
    return emu.load(emu.build())


def kernels(emu_lib, cores: int = 8, tiny: bool = False):
    return emu_module().EmuKernels(emu_lib, cores=cores, **(TINY if tiny else {}))


def ref_stats(logits: torch.Tensor, targets: torch.Tensor, tau: float):
    """float64 logp, entropy and the row statistics stats (2, N) = [max z; log sum exp(z - max z)], all in the shifted
    form; ignored rows 0 (stats too)."""
    z = logits.double() / tau
    m = z.max(-1).values
    log_s = torch.logsumexp(z - m[:, None], -1)
    logp_all = (z - m[:, None]) - log_s[:, None]
    ent = -(logp_all.exp() * logp_all).sum(-1)
    keep = targets != IGNORE
    logp = logp_all.gather(1, targets.clamp(min=0)[:, None]).squeeze(1)
    zero = torch.zeros_like(m)
    stats = torch.stack((torch.where(keep, m, zero), torch.where(keep, log_s, zero)))
    return torch.where(keep, logp, zero), torch.where(keep, ent, zero), stats


def ref_grad(logits, targets, gl, gh, tau):
    """float64 dL/dlogits of docs/design.md (log p in the shifted form); ignored rows 0."""
    z = logits.double() / tau
    m = z.max(-1, keepdim=True).values
    logp = (z - m) - torch.logsumexp(z - m, -1, keepdim=True)
    p = logp.exp()
    ent = -(p * logp).sum(-1, keepdim=True)
    onehot = torch.zeros_like(z)
    onehot.scatter_(1, targets.clamp(min=0)[:, None], 1.0)
    gl = gl.double()[:, None]
    gh = torch.zeros_like(gl) if gh is None else gh.double()[:, None]
    dz = gl * (onehot - p) - gh * p * (logp + ent)
    return torch.where((targets != IGNORE)[:, None], dz / tau, torch.zeros_like(dz))


def _poisoned(n: int):
    """NaN-filled logp (N,), entropy (N,) and stats (2, N) output buffers."""
    return torch.full((n,), float("nan")), torch.full((n,), float("nan")), torch.full((2, n), float("nan"))


def make_case(n: int, v: int, dtype: torch.dtype, seed: int = 0, scale: float = 3.0, ignore_every: int = 4):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, v, generator=g) * scale).to(dtype)
    targets = torch.randint(0, v, (n,), generator=g)
    targets[::ignore_every] = IGNORE
    if n > 2:
        targets[1] = v - 1  # target in the last (tail) column
    return logits, targets


def assert_close_f32(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    err = (out.double() - ref).abs()
    tol = 3e-5 * (1.0 + ref.abs())
    assert torch.isfinite(out).all(), f"{what}: non-finite (unwritten?) values"
    assert (err <= tol).all(), f"{what}: max err {err.max().item():.3g}"


def assert_close_dtype(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """A result rounded to out.dtype: within one rounding of |ref| plus fp32-level error."""
    eps = {torch.float32: 2e-6, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-10}[out.dtype]
    err = (out.double() - ref).abs()
    tol = eps * ref.abs() + 2e-5 * ref.abs().max().clamp(min=1e-3)
    assert torch.isfinite(out).all(), f"{what}: non-finite (unwritten?) values"
    assert (err <= tol).all(), f"{what}: max err {err.max().item():.3g} (max |ref| {ref.abs().max().item():.3g})"


SHAPES = [(1, 1), (1, 7), (5, 63), (13, 1001), (67, 257), (9, 8195)]


@pytest.mark.parametrize("tiny", [False, True], ids=["ub192k", "tiny-tiles"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,v", SHAPES)
def test_stats_finalize(emu_lib, n, v, dtype, tiny):
    logits, targets = make_case(n, v, dtype)
    tau = 0.7
    k = kernels(emu_lib, cores=3, tiny=tiny)
    logp, ent, stats = _poisoned(n)
    k.logits_stats(logits, targets, torch.empty(0, STATE_FLOATS), logp, ent, stats, 0,
                   FINALIZE | WRITE_ENTROPY | WRITE_STATS, 1.0 / tau, IGNORE)
    r_logp, r_ent, r_stats = ref_stats(logits, targets, tau)
    assert_close_f32(logp, r_logp, "logp")
    assert_close_f32(ent, r_ent, "entropy")
    assert_close_f32(stats, r_stats, "stats")
    if tiny and v > 256:
        assert k.launches[-1]["n_tiles"] > 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_stats_over_vocab_chunks(emu_lib, dtype):
    """The linear-head path: state carried across [N, Vc] chunks (HAS_PREV / WRITE_STATE), chunk offsets v0."""
    n, v = 70, 1500
    logits, targets = make_case(n, v, dtype, seed=1, scale=5.0)
    k = kernels(emu_lib, cores=5, tiny=True)
    state = torch.full((n, STATE_FLOATS), float("nan"))
    logp, ent, stats = _poisoned(n)
    bounds = [0, 320, 321, 1024, v]  # includes a 1-column chunk
    for i in range(len(bounds) - 1):
        v0, v1 = bounds[i], bounds[i + 1]
        last = v1 == v
        final = FINALIZE | WRITE_ENTROPY | WRITE_STATS
        flags = (HAS_PREV if i else 0) | (final if last else WRITE_STATE)
        k.logits_stats(logits[:, v0:v1].contiguous(), targets, state, logp, ent, stats, v0, flags, 1.0, IGNORE)
    r_logp, r_ent, r_stats = ref_stats(logits, targets, 1.0)
    assert_close_f32(logp, r_logp, "logp")
    assert_close_f32(ent, r_ent, "entropy")
    assert_close_f32(stats, r_stats, "stats")


def test_stats_strided_rows_and_no_entropy(emu_lib):
    """Rows at an odd GM stride (unaligned row starts) and entropy / stats not requested (buffers untouched)."""
    n, v = 11, 333
    wide, targets = make_case(n, v + 5, torch.bfloat16, seed=2)
    targets = targets.clamp(max=v - 1)
    targets[0] = IGNORE
    logits = wide[:, :v]
    assert logits.stride(0) == v + 5
    logp = torch.full((n,), float("nan"))
    kernels(emu_lib, cores=4, tiny=True).logits_stats(logits, targets, torch.empty(0, STATE_FLOATS), logp,
                                                      torch.empty(0), torch.empty(0), 0, FINALIZE, 1.0, IGNORE)
    assert_close_f32(logp, ref_stats(logits, targets, 1.0)[0], "logp")


def test_all_rows_ignored_and_more_cores_than_rows(emu_lib):
    n, v = 3, 100
    logits, targets = make_case(n, v, torch.float32)
    targets[:] = IGNORE
    logp, ent, stats = _poisoned(n)
    k = kernels(emu_lib, cores=48)
    k.logits_stats(logits, targets, torch.empty(0, STATE_FLOATS), logp, ent, stats, 0,
                   FINALIZE | WRITE_ENTROPY | WRITE_STATS, 1.0, IGNORE)
    assert k.launches[-1]["block_dim"] == 3
    assert (logp == 0).all() and (ent == 0).all() and (stats == 0).all()
    out = torch.full_like(logits, float("nan"))
    k.logits_grad(logits, out, targets, stats, ent, torch.ones(n), torch.ones(n), 0, 1.0, IGNORE)
    assert (out == 0).all()


@pytest.mark.parametrize("with_entropy", [True, False], ids=["gH", "no-gH"])
@pytest.mark.parametrize("tiny", [False, True], ids=["ub192k", "tiny-tiles"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,v", SHAPES)
def test_grad(emu_lib, n, v, dtype, tiny, with_entropy):
    logits, targets = make_case(n, v, dtype, seed=3)
    tau = 1.3
    g = torch.Generator().manual_seed(4)
    gl = torch.randn(n, generator=g)
    gh = torch.randn(n, generator=g) if with_entropy else None
    if n > 3:
        gl[2] = 0.0  # a zero-gradient row (skipped: written as zeros)
        if gh is not None:
            gh[2] = 0.0
    r_logp, r_ent, r_stats = ref_stats(logits, targets, tau)
    stats, ent = r_stats.float(), r_ent.float()
    out = torch.full_like(logits, float("nan"))
    kernels(emu_lib, cores=3, tiny=tiny).logits_grad(logits, out, targets, stats, ent if with_entropy else None, gl,
                                                     gh, 0, 1.0 / tau, IGNORE)
    ref = ref_grad(logits, targets, gl, gh, tau)
    assert_close_dtype(out, ref, "grad_logits")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grad_in_place_chunk_with_offset(emu_lib, dtype):
    """The LM-head backward: one [N, Vc] chunk at column offset v0, gradient written over the logits in place."""
    n, v = 20, 900
    logits, targets = make_case(n, v, dtype, seed=5)
    targets[3] = 450  # inside the chunk
    g = torch.Generator().manual_seed(6)
    gl, gh = torch.randn(n, generator=g), torch.randn(n, generator=g)
    _, r_ent, r_stats = ref_stats(logits, targets, 1.0)
    ref = ref_grad(logits, targets, gl, gh, 1.0)
    v0, v1 = 300, 700
    chunk = logits[:, v0:v1].contiguous()
    kernels(emu_lib, cores=6, tiny=True).logits_grad(chunk, chunk, targets, r_stats.float(), r_ent.float(), gl, gh, v0,
                                                     1.0, IGNORE)
    assert_close_dtype(chunk, ref[:, v0:v1], "grad chunk")


def test_ub_overflow_is_reported(emu_lib):
    """A tile too wide for 192 KiB is refused by the emulated TPipe, as the NPU would fail with error 507015."""
    n, v = 2, 40000
    logits = torch.randn(n, v)
    logp = torch.empty(n)
    rc = emu_lib.sgrpo_emu_logits_stats(1, 0, logits.data_ptr(), torch.zeros(n, dtype=torch.int64).data_ptr(), None,
                                        logp.data_ptr(), None, None, n, v, v, 0, 16384, FINALIZE, 1.0, IGNORE)
    assert rc != 0
    assert "UB overflow" in emu_lib.sgrpo_emu_last_error().decode()


def test_tiling_agrees_with_kernel_budget(emu_lib):
    """The host tiling (the same header) never asks for more UB than the kernel's allocations (checked by the
    emulator on every launch above) and uses 8192-wide tiles for a Qwen-sized bf16 row."""
    k = kernels(emu_lib, cores=40)
    t = k.tiling(8192, 151936, 2, grad=False)
    assert t["tile"] == 8192 and t["n_tiles"] == 19 and t["ub_bytes"] <= 192 * 1024 and t["block_dim"] == 40
    t = k.tiling(8192, 151936, 4, grad=True)
    assert t["ub_bytes"] <= 192 * 1024 and t["tile"] % 64 == 0
