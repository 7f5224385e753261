"""`npu` backend: Ascend NPUs through torch_npu (PrivateUse1 device type "npu") and the AscendC kernels of csrc/ascend.

Orchestration (this module) per vocab chunk of Vc columns, Vc bounded by the memory budget so [N, V] never exists:

* forward: ``z_c = hidden @ W_c^T (+ b_c)`` on the cube unit through torch_npu, then the AscendC vector kernel
  ``sgrpo_npu::logits_stats`` folds the chunk into per-row fp32 running statistics (max, sum-exp, sum p*z, target logit;
  a [N, 8] state tensor) and, on the last chunk, writes logp = (z_y - m) - ln s, entropy and the row statistics
  stats = [m; ln s] (a [2, N] tensor: the contract's `stats`, apart because m + ln s rounds ln s away at large |m|);
* backward: rows with ignore_index or with both upstream gradients exactly zero are dropped first (index_select), the
  chunk is recomputed for the remaining rows only, ``sgrpo_npu::logits_grad_`` turns it into dL/dlogits in place
  (log p = (z - m) - ln s from stats), then
  ``grad_hidden += dZ @ W_c`` (fp32 accumulator) and ``grad_W_c = dZ^T @ h`` (each chunk owns its rows of grad_W);
* ``logprobs_from_logits``: the same two kernels over whole rows (the kernel streams UB-sized tiles of V).

The module imports without torch_npu; `is_available()` says why the backend cannot run. The compiled ops come from the
extension built by setup.py where CANN exists (``sgrpo_kernels/backends/_sgrpo_npu*.so`` or env ``SGRPO_NPU_LIB``).
Tests swap in the CPU emulation of the same kernels with `use_kernels()` (csrc/emu/sgrpo_emu.py).
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch

from sgrpo_kernels.backends.contract import BackendUnavailableError, Options

DEVICE_TYPES: tuple[str, ...] = ("npu",)

ENV_LIB = "SGRPO_NPU_LIB"

# Kernel interface constants: THE Python definition of what csrc/ascend/sgrpo_tiling.h defines for C++ (the header is
# not installed with the package, so it cannot be read at import). The CPU emulation driver (csrc/emu/sgrpo_emu.py)
# and the tests import them from here; tests/test_npu_constants.py checks every value against the header.
# Flags of the statistics kernel (sgrpo::kHasPrev ... kWriteStats) and of the gradient kernel (sgrpo::kHasGradEntropy).
HAS_PREV, WRITE_STATE, FINALIZE, WRITE_ENTROPY, WRITE_STATS = 1, 2, 4, 8, 16
HAS_GRAD_ENTROPY = 1
STATE_FLOATS = 8  # floats of packed running state per row (sgrpo::kStateFloats)
DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # sgrpo::kFloat32 / kFloat16 / kBFloat16
UB_BYTES = 192 * 1024  # unified buffer of one AIV core (sgrpo::kUbBytes)
MAX_TILE = 8192  # largest vocab tile in elements (sgrpo::kMaxTile)

DEFAULT_CHUNK_BYTES = 256 * 1024 * 1024  # [N, Vc] logits chunk
CHUNK_QUANTUM = 256  # vocab columns; keeps chunk rows 32 B aligned for every dtype and cube-friendly
_SUPPORTED = tuple(DTYPE_CODE)


class Kernels(Protocol):
    """The two compiled ops (torch.ops.sgrpo_npu.* on an NPU, the CPU emulation in tests). `stats` is the contiguous
    fp32 (2, N) [row max m; ln s] of the contract."""

    def logits_stats(self, logits: torch.Tensor, targets: torch.Tensor, state: torch.Tensor, logp: torch.Tensor,
                     entropy: torch.Tensor, stats: torch.Tensor, v0: int, flags: int, inv_tau: float,
                     ignore_index: int) -> None: ...

    def logits_grad(self, logits: torch.Tensor, out: torch.Tensor, targets: torch.Tensor, stats: torch.Tensor,
                    entropy: torch.Tensor | None, grad_logp: torch.Tensor, grad_entropy: torch.Tensor | None,
                    v0: int, inv_tau: float, ignore_index: int) -> None: ...


class _TorchNpuKernels:
    """Calls the ops registered by csrc/ascend/sgrpo_binding.cpp for PrivateUse1."""

    def logits_stats(self, logits, targets, state, logp, entropy, stats, v0, flags, inv_tau, ignore_index) -> None:
        torch.ops.sgrpo_npu.logits_stats(logits, targets, state, logp, entropy, stats, v0, flags, inv_tau,
                                         ignore_index)

    def logits_grad(self, logits, out, targets, stats, entropy, grad_logp, grad_entropy, v0, inv_tau,
                    ignore_index) -> None:
        if out.data_ptr() == logits.data_ptr():
            torch.ops.sgrpo_npu.logits_grad_(logits, targets, stats, entropy, grad_logp, grad_entropy, v0, inv_tau,
                                             ignore_index)
        else:
            torch.ops.sgrpo_npu.logits_grad(logits, out, targets, stats, entropy, grad_logp, grad_entropy, v0,
                                            inv_tau, ignore_index)


_override: Kernels | None = None
_ext_status: tuple[bool, str] | None = None


@contextlib.contextmanager
def use_kernels(kernels: Kernels) -> Iterator[Kernels]:
    """Run this backend's orchestration with other kernel implementations (tests: the CPU emulation)."""
    global _override
    prev, _override = _override, kernels
    try:
        yield kernels
    finally:
        _override = prev


def _library_path() -> str | None:
    env = os.environ.get(ENV_LIB)
    if env:
        return env
    found = sorted(glob.glob(str(Path(__file__).with_name("_sgrpo_npu")) + "*.so"))
    return found[0] if found else None


def _load_extension() -> tuple[bool, str]:
    global _ext_status
    if _ext_status is not None:
        return _ext_status
    try:
        import torch_npu  # noqa: F401  (registers the "npu" device type)
    except Exception as exc:  # ImportError, or CANN libraries missing at import time
        _ext_status = (False, f"torch_npu is not importable ({type(exc).__name__}: {exc}); "
                              "install `sgrpo-kernels[npu]` on an Ascend machine with CANN")
        return _ext_status
    path = _library_path()
    if path is None:
        _ext_status = (False, "the AscendC extension is not built: reinstall with ASCEND_HOME_PATH and SOC_VERSION set "
                              f"(see csrc/README.md) or point {ENV_LIB} at libsgrpo_npu.so")
        return _ext_status
    try:
        torch.ops.load_library(path)
    except Exception as exc:
        _ext_status = (False, f"loading the AscendC extension {path} failed: {exc}")
        return _ext_status
    _ext_status = (True, "")
    return _ext_status


def is_available() -> tuple[bool, str]:
    return _load_extension()


def _kernels() -> Kernels:
    if _override is not None:
        return _override
    ok, why = _load_extension()
    if not ok:
        raise BackendUnavailableError(f"npu backend unavailable: {why}")
    return _TorchNpuKernels()


def _check_dtype(name: str, t: torch.Tensor) -> None:
    if t.dtype not in _SUPPORTED:
        raise TypeError(f"npu backend: {name} has dtype {t.dtype}; expected one of {list(_SUPPORTED)}")


def vocab_chunk(n_rows: int, vocab: int, elem_bytes: int, memory_budget: int = 0) -> int:
    """Columns per [n_rows, Vc] logits chunk: as many as the budget holds, a multiple of CHUNK_QUANTUM, <= vocab."""
    budget = memory_budget if memory_budget > 0 else DEFAULT_CHUNK_BYTES
    cols = budget // max(1, n_rows * elem_bytes)
    cols = max(CHUNK_QUANTUM, cols // CHUNK_QUANTUM * CHUNK_QUANTUM)
    return min(vocab, cols)


def _stats_out(n: int, opts: Options, device: torch.device) -> torch.Tensor:
    """The forward's (2, N) fp32 row statistics [m; ln s] (written by the kernel), or (2, 0) when not requested."""
    return torch.empty((2, n if opts.need_stats else 0), dtype=torch.float32, device=device)


def _saved_stats(stats: torch.Tensor, n: int) -> torch.Tensor:
    if stats.shape != (2, n):
        raise ValueError(f"npu backend: stats has shape {tuple(stats.shape)}, expected (2, {n}) (forward with "
                         "need_stats=False?)")
    return stats.float()


def _logits_chunk(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, v0: int,
                  v1: int) -> torch.Tensor:
    """[N, v1 - v0] logits in hidden's dtype (cube unit, fp32 accumulation inside the matmul)."""
    w = weight[v0:v1]
    if bias is None:
        return torch.mm(hidden, w.t())
    return torch.addmm(bias[v0:v1].to(hidden.dtype), hidden, w.t())


def linear_logprobs_fwd(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                        bias: torch.Tensor | None, opts: Options) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden (N, D), weight (V, D), targets (N,) -> logp (N,), entropy (N,) | (0,), stats (2, N) | (2, 0), all
    fp32."""
    _refuse_softcap(opts)
    _check_dtype("hidden", hidden)
    kern = _kernels()
    n, v = hidden.shape[0], weight.shape[0]
    dev = hidden.device
    f32 = dict(dtype=torch.float32, device=dev)
    logp = torch.empty(n, **f32)
    entropy = torch.empty(n if opts.return_entropy else 0, **f32)
    stats = _stats_out(n, opts, dev)
    if n == 0:
        return logp, entropy, stats
    hidden = hidden.contiguous()
    weight = weight.to(hidden.dtype) if weight.dtype != hidden.dtype else weight
    targets = targets.to(torch.int64).contiguous()
    chunk = vocab_chunk(n, v, hidden.element_size(), opts.memory_budget)
    state = torch.empty((n if chunk < v else 0, STATE_FLOATS), **f32)
    final = FINALIZE | (WRITE_ENTROPY if opts.return_entropy else 0) | (WRITE_STATS if opts.need_stats else 0)
    for v0 in range(0, v, chunk):
        v1 = min(v, v0 + chunk)
        z = _logits_chunk(hidden, weight, bias, v0, v1)  # (N, Vc)
        flags = (HAS_PREV if v0 > 0 else 0) | (WRITE_STATE if v1 < v else final)
        kern.logits_stats(z, targets, state, logp, entropy, stats, v0, flags, 1.0 / opts.temperature,
                          opts.ignore_index)
    return logp, entropy, stats


def _active_rows(targets: torch.Tensor, grad_logp: torch.Tensor, grad_entropy: torch.Tensor | None,
                 ignore_index: int) -> torch.Tensor:
    nz = grad_logp != 0
    if grad_entropy is not None:
        nz = nz | (grad_entropy != 0)
    return ((targets != ignore_index) & nz).nonzero().squeeze(1)


def linear_logprobs_bwd(grad_logp: torch.Tensor, grad_entropy: torch.Tensor | None, hidden: torch.Tensor,
                        weight: torch.Tensor, targets: torch.Tensor, bias: torch.Tensor | None, stats: torch.Tensor,
                        entropy: torch.Tensor | None,
                        opts: Options) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """-> grad_hidden (N, D) hidden.dtype, grad_weight (V, D) weight.dtype, grad_bias (V,) | None."""
    _refuse_softcap(opts)
    kern = _kernels()
    n, d = hidden.shape
    v = weight.shape[0]
    grad_hidden = torch.zeros_like(hidden)
    grad_weight = torch.zeros_like(weight)
    grad_bias = torch.zeros_like(bias) if bias is not None else None
    if n == 0:
        return grad_hidden, grad_weight, grad_bias
    stats = _saved_stats(stats, n)
    targets = targets.to(torch.int64)
    rows = _active_rows(targets, grad_logp, grad_entropy, opts.ignore_index)  # zero-gradient rows are skipped
    na = rows.numel()
    if na == 0:
        return grad_hidden, grad_weight, grad_bias
    full = na == n

    def pick(t: torch.Tensor) -> torch.Tensor:
        return (t if full else t.index_select(0, rows)).contiguous()

    h = pick(hidden)
    w = weight.to(hidden.dtype) if weight.dtype != hidden.dtype else weight
    t_a, gl_a = pick(targets), pick(grad_logp.float())
    st_a = (stats if full else stats.index_select(1, rows)).contiguous()
    ge_a = pick(grad_entropy.float()) if grad_entropy is not None else None
    ent_a = pick(entropy.float()) if grad_entropy is not None and entropy is not None else None
    if ge_a is not None and ent_a is None:
        raise ValueError("npu backend: grad_entropy given but entropy is None")
    gh_acc = torch.zeros((na, d), dtype=torch.float32, device=hidden.device)
    chunk = vocab_chunk(na, v, hidden.element_size(), opts.memory_budget)
    inv_tau = 1.0 / opts.temperature
    for v0 in range(0, v, chunk):
        v1 = min(v, v0 + chunk)
        z = _logits_chunk(h, w, bias, v0, v1)  # recomputed (Na, Vc)
        kern.logits_grad(z, z, t_a, st_a, ent_a, gl_a, ge_a, v0, inv_tau, opts.ignore_index)  # z := dL/dlogits
        gh_acc.add_(torch.mm(z, w[v0:v1]))
        grad_weight[v0:v1] = torch.mm(z.t(), h).to(weight.dtype)
        if grad_bias is not None:
            grad_bias[v0:v1] = z.float().sum(0).to(grad_bias.dtype)
    if full:
        grad_hidden.copy_(gh_acc)
    else:
        grad_hidden.index_copy_(0, rows, gh_acc.to(hidden.dtype))
    return grad_hidden, grad_weight, grad_bias


def logprobs_from_logits_fwd(logits: torch.Tensor, targets: torch.Tensor,
                             opts: Options) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits (N, V), targets (N,) -> logp (N,), entropy (N,) | (0,), stats (2, N) | (2, 0), fp32."""
    _check_dtype("logits", logits)
    kern = _kernels()
    n = logits.shape[0]
    f32 = dict(dtype=torch.float32, device=logits.device)
    logp = torch.empty(n, **f32)
    entropy = torch.empty(n if opts.return_entropy else 0, **f32)
    stats = _stats_out(n, opts, logits.device)
    if n == 0:
        return logp, entropy, stats
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    flags = FINALIZE | (WRITE_ENTROPY if opts.return_entropy else 0) | (WRITE_STATS if opts.need_stats else 0)
    state = torch.empty((0, STATE_FLOATS), **f32)
    kern.logits_stats(logits, targets.to(torch.int64).contiguous(), state, logp, entropy, stats, 0, flags,
                      1.0 / opts.temperature, opts.ignore_index)
    return logp, entropy, stats


def logprobs_from_logits_bwd(grad_logp: torch.Tensor, grad_entropy: torch.Tensor | None, logits: torch.Tensor,
                             targets: torch.Tensor, stats: torch.Tensor, entropy: torch.Tensor | None,
                             opts: Options) -> torch.Tensor:
    """-> grad_logits (N, V) logits.dtype; written into `logits` itself when opts.inplace_backward."""
    kern = _kernels()
    n = logits.shape[0]
    if n == 0:
        return logits if opts.inplace_backward else torch.zeros_like(logits)
    stats = _saved_stats(stats, n)
    inplace = opts.inplace_backward and logits.stride(-1) == 1
    src = logits if logits.stride(-1) == 1 else logits.contiguous()
    out = src if inplace else torch.empty_like(src, memory_format=torch.contiguous_format)
    ent = None
    if grad_entropy is not None:
        if entropy is None or entropy.numel() != n:
            raise ValueError("npu backend: grad_entropy given but the forward entropy is missing")
        ent = entropy.float().contiguous()
        grad_entropy = grad_entropy.float().contiguous()
    kern.logits_grad(src, out, targets.to(torch.int64).contiguous(), stats.contiguous(), ent,
                     grad_logp.float().contiguous(), grad_entropy, 0, 1.0 / opts.temperature, opts.ignore_index)
    if opts.inplace_backward and not inplace:
        logits.copy_(out)
        return logits
    return out


def _refuse_softcap(opts: Options) -> None:
    if opts.softcap:
        raise NotImplementedError(
            f"the npu backend does not apply a logit softcap (softcap={opts.softcap:g}) yet; use backend='torch' "
            "for this model"
        )
