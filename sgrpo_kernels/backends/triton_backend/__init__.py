"""The `triton` backend: fused LM head -> log-prob + entropy kernels for CUDA (and CPU under TRITON_INTERPRET=1).

This package is the backend's face: `DEVICE_TYPES`, `is_available()` and the four entry points of the backend contract
(sgrpo_kernels/backends/contract.py). The whole design (math, layers, backends): docs/design.md.

One module per stage, layered kernel -> configuration -> launcher:
    tiles.py      shared @triton.jit tile helpers: mma, logits tile, online update, target logit, final store
    forward.py    linear_logprobs forward kernel and the merge of its vocab splits
    backward.py   linear_logprobs backward kernels: row compaction, dZ, grad_hidden, grad_W (and grad_b)
    logits.py     logprobs_from_logits forward and backward kernels
    configs.py    GPU or interpreter, autotune candidates, interpreter tiles, SGRPO_TRITON_AUTOTUNE, `launch`
    launchers.py  the four entry points: buffers, dtypes, vocab split and chunks, compaction, launches; `Hooks`
The kernels keep their `_..._kernel` names: a profile names a kernel after its Python function, and
benchmarks/profile_gpu.py looks them up by those names.

linear_logprobs forward
    Grid (row blocks, vocab splits). A program owns BLOCK_M rows and one contiguous vocab span; for each BLOCK_V
    column block it computes the logits tile z = (h @ W^T + b) / tau with `tl.dot` over D (fp32 accumulator; the
    tile lives only in registers) and folds it into per-row online statistics in fp32:
        m = running max,  s = sum exp(z - m),  u = sum exp(z - m) * (z - m),  z_y = target logit
    (u is kept relative to m, as in the torch backend, so H = log s - u / s never cancels two large numbers), then
    logp = (z_y - m) - log s, and stats = [m; log s] for the backward (never lse = m + log s, which rounds log s
    away at large |m|). When the row blocks alone cannot fill the GPU the vocabulary is split across programs; each
    writes its partial (m, s, u, z_y) and `_linear_logprobs_merge_kernel` combines them (a log-sum-exp merge) into
    logp, entropy, stats.

linear_logprobs backward (no atomics: every output element is owned by one program; deterministic by construction)
    1. Device-side compaction of the active rows (target != ignore_index and a non-zero upstream gradient): an
       inclusive cumsum (torch, on device) and `_compact_rows_kernel` scattering each active row to its rank build
       `idx` (active rows first) and a one-element device `count`. No host synchronization: every later grid is sized
       for the worst case (all N rows) and programs past `count` exit at once, or loop only up to `count`.
    2. For each vocab chunk [v0, v0 + vc) (vc from the memory budget):
       `_linear_logprobs_bwd_dz_kernel` recomputes the logits tile of the active rows (tl.dot over D) and writes
           dZ = [g_logp (1[j = y] - p) - g_H p (log p + H)] / tau,  log p = (z - m) - log s,
           into a (N, vc) buffer, compacted row order;
       `_linear_logprobs_bwd_dh_kernel`  grad_h[idx] += dZ @ W[v0:v0+vc]   (fp32 accumulator buffer, K = vc);
       `_linear_logprobs_bwd_dw_kernel`  grad_W[v0:v0+vc] = dZ^T @ h[idx], grad_b = column sums of dZ, K = count:
           the loop over active rows stops at the device-side count, so the cost is proportional to active rows.
    dZ is stored in the input dtype (bf16/fp16; fp32 for fp32 inputs) like a cuBLAS-fed GEMM would; all products
    accumulate in fp32. Chunks run in stream order and each (row, d) / (v, d) tile is written by exactly one program,
    so gradients are bitwise identical run to run; there is no deterministic mode to ask for.

logprobs_from_logits
    Forward: one pass over V per row block with the same online statistics. Backward: per row block, vocab chunk by
    vocab chunk, dlogits written into a new buffer or (opts.inplace_backward) into `logits` itself; rows without
    gradient get zeros without reading their logits.

Dtypes: fp32, bf16, fp16 computed natively (tl.dot in the input dtype, fp32 accumulation; fp32 dot products use
"ieee" precision, never TF32). fp64 inputs are computed in fp32 (the kernels read fp32 copies); outputs and gradients
are returned in fp64 but are fp32-accurate: use the torch backend when fp64 accuracy matters.

Test hooks: every entry point takes a keyword-only `hooks=Hooks(splits=..., poison=...)` (a forced number of vocab
splits in the linear forward; NaN-filled output and scratch buffers). The default, `NO_HOOKS`, changes nothing.
"""

from __future__ import annotations

import torch
import triton

from .configs import INTERPRET
from .launchers import (
    NO_HOOKS,
    Hooks,
    linear_logprobs_bwd,
    linear_logprobs_fwd,
    logprobs_from_logits_bwd,
    logprobs_from_logits_fwd,
)

__all__ = ["APPLIES_THRESHOLD", "DEVICE_TYPES", "NO_HOOKS", "Hooks", "is_available", "linear_logprobs_bwd",
           "linear_logprobs_fwd", "logprobs_from_logits_bwd", "logprobs_from_logits_fwd"]

DEVICE_TYPES = ("cuda", "cpu") if INTERPRET else ("cuda",)
APPLIES_THRESHOLD = True  # the sampler's support: every kernel takes the (N,) threshold (contract: `threshold=`)


def _version(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def _interpreter_problem(triton_version: str, numpy_version: str) -> str:
    """Why this triton's interpreter cannot run our kernels with this numpy ("" when it can). Triton <= 3.6 turns
    1-element arrays into Python ints (loop bounds), which numpy >= 2.4 refuses; triton 3.7+ does not."""
    if _version(triton_version) < (3, 7) and _version(numpy_version) >= (2, 4):
        return (f"TRITON_INTERPRET=1 with triton {triton_version} needs numpy < 2.4 (found numpy {numpy_version}: "
                "its interpreter converts 1-element arrays to int, an error since numpy 2.4); "
                "install 'numpy<2.4' or 'triton>=3.7'")
    return ""


def is_available() -> tuple[bool, str]:
    if INTERPRET:
        import numpy

        problem = _interpreter_problem(triton.__version__, numpy.__version__)
        return (False, problem) if problem else (True, "")
    if not torch.cuda.is_available():
        return False, "no CUDA device (set TRITON_INTERPRET=1 to run the kernels on CPU tensors in the interpreter)"
    return True, ""
