"""The backend contract: what every backend implements and everything a backend may import from this package.

A backend is a module that satisfies :class:`Backend`. The public ops (``sgrpo_kernels.ops``) validate every input,
flatten leading dims and pick the backend before calling it, so a backend may assume well-formed 2-D / 1-D tensors:

```
linear_logprobs_fwd(hidden (N, D), weight (V, D), targets (N,) int64, bias (V,) | None, opts: Options)
    -> (logp (N,), entropy (N,) or empty (0,) when not opts.return_entropy, stats (2, N) or empty (2, 0) when not
        opts.need_stats), all in stats_dtype(hidden.dtype)
linear_logprobs_bwd(grad_logp (N,), grad_entropy (N,) | None, hidden, weight, targets, bias, stats (2, N),
                    entropy (N,) | None, opts: Options)
    -> (grad_hidden (N, D) hidden.dtype, grad_weight (V, D) weight.dtype, grad_bias (V,) bias.dtype | None)
       (grad_hidden may be None when not opts.need_grad_hidden; grad_weight and grad_bias when not
       opts.need_grad_weight)
logprobs_from_logits_fwd(logits (N, V), targets (N,), opts) -> (logp, entropy | empty, stats | empty)
logprobs_from_logits_bwd(grad_logp, grad_entropy | None, logits, targets, stats, entropy | None, opts)
    -> grad_logits (N, V) logits.dtype; when opts.inplace_backward, the gradient is written into `logits` itself and
       `logits` is returned.
```

``stats`` is what the forward keeps for the backward, the row statistics of z = logits / temperature:
``stats[0] = m = max_j z_j`` and ``stats[1] = log s = log sum_j exp(z_j - m)`` (0 and 0 on ignored rows). They stay
apart, never summed into lse = m + log s: at large |z| that sum rounds log s away (ulp(1e8) = 8 in fp32), so every
log-probability is formed in the shifted form, ``logp = (z_y - m) - log s`` in the forward and
``log p_j = (z_j - m) - log s`` in the backward (docs/design.md, "The math"). The forward returns stats contiguous,
so stats[0] and stats[1] are contiguous (N,) vectors; a backward given any other layout makes it contiguous first.

``opts`` is an :class:`Options`: the caller's :class:`HeadOptions` (temperature, ignore_index, logit_scale, softcap)
and the fields the op sets per call (return_entropy, need_stats, memory_budget, ...). Without a softcap the ops have
folded logit_scale into the temperature, so a backend that serves no softcap needs no logit scale either.

The sampler's support (top_k / top_p / min_p, sgrpo_kernels/truncation.py): a backend whose module sets
``APPLIES_THRESHOLD = True`` also takes a keyword ``threshold`` (N,) in all four entry points, the per-row logit
threshold of z = logits / temperature: it treats every z < threshold[row] as -inf (p = 0), except at the row's target,
in the forward and, with the same threshold, in the backward (the support held fixed). The ops pass it only when the
caller asked for a support, and refuse the settings on a backend without the attribute.

Rows whose target equals ``opts.ignore_index`` produce logp = 0, entropy = 0 and no gradient. ``grad_entropy is None``
means the entropy output received no gradient (or was not requested). Rows whose two upstream gradients are exactly
zero contribute nothing; backends should skip them before the matrix products.

Backends import only this module from sgrpo_kernels (never each other, the registry, the ops or the RL layer).
The math and the layers: docs/design.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from sgrpo_kernels.validation import (
    check_ignore_index,
    check_logit_scale,
    check_softcap,
    check_temperature,
    env_flag,
)

__all__ = ["HEAD_FIELDS", "Backend", "BackendUnavailableError", "HeadOptions", "Options", "env_flag", "stats_dtype"]


def stats_dtype(input_dtype: torch.dtype) -> torch.dtype:
    """The one dtype rule of the package: logp / entropy / stats, the torch backend's accumulation and the RL layer's
    loss arithmetic are float32, or float64 for float64 inputs (bf16, fp16, fp32 and integer inputs give float32)."""
    return torch.float64 if input_dtype == torch.float64 else torch.float32


class BackendUnavailableError(RuntimeError):
    """A backend cannot run here (not installed, wrong device, no compiled kernels, ...). Raised by the registry when
    it resolves a backend, and by a backend that finds out only when called (e.g. the npu extension fails to load)."""


@dataclass(frozen=True)
class HeadOptions:
    """The head options of one call: how a row's raw logits x = h W^T + b become the z of the softmax,

        z = softcap * tanh(logit_scale * x / softcap) / temperature   (softcap > 0: Gemma 2/3)
        z = logit_scale * x / temperature                             (softcap = 0: no cap)

    and which target marks an ignored row. The public ops take these fields as keyword arguments, build one
    HeadOptions (``from_kwargs``: each value validated by the ``check`` in its field's metadata) and hand it down
    inside :class:`Options`; the custom-op schemas are generated from the fields. A new head option is one field here
    (a default that leaves the head unchanged, and a check) plus the backends that implement it; the others refuse a
    non-default value by name, as the npu backend refuses a softcap.
    """

    temperature: float = field(default=1.0, metadata={"check": check_temperature})
    ignore_index: int = field(default=-100, metadata={"check": check_ignore_index})
    logit_scale: float = field(default=1.0, metadata={"check": check_logit_scale})
    # 0.0 = no cap (a schema argument is a plain float); the public keyword says None
    softcap: float = field(default=0.0, metadata={"check": check_softcap})

    @classmethod
    def from_kwargs(cls, op: str, kwargs: dict[str, object], accepted: tuple[str, ...] | None = None) -> HeadOptions:
        """The options named in `kwargs` (the public keywords), each validated; the others keep their defaults.
        `accepted`: the fields `op` serves (default: all); any other name is refused as Python refuses an unknown
        keyword."""
        names = HEAD_FIELDS if accepted is None else accepted
        for name in kwargs:
            if name not in names:
                raise TypeError(f"{op}() got an unexpected keyword argument {name!r} (head options it takes: "
                                f"{', '.join(names)})")
        return cls(**{name: _HEAD_CHECKS[name](value) for name, value in kwargs.items()})

    @property
    def nonlinear_head(self) -> bool:
        """True when z is not a constant multiple of x (a softcap). When it is, the ops fold logit_scale into the
        temperature (exact), so a backend sees logit_scale 1.0."""
        return self.softcap > 0

    def head_slope(self, x: Tensor) -> Tensor:
        """d(temperature * z) / dx at the raw logits `x` of a nonlinear head: the factor by which a gradient with
        respect to z / temperature reaches the raw logits."""
        s, c = self.logit_scale, self.softcap
        return s * (1 - torch.tanh(s * x / c) ** 2)


HEAD_FIELDS = tuple(f.name for f in fields(HeadOptions))
_HEAD_CHECKS = {f.name: f.metadata["check"] for f in fields(HeadOptions)}


@dataclass(frozen=True)
class Options(HeadOptions):
    """Everything a backend receives per call: the :class:`HeadOptions` fields, then what the op decides per call
    (which outputs, memory, which gradients). The ops build one per call; every field has a safe default."""

    return_entropy: bool = True
    need_stats: bool = True  # False for no-grad calls: no row statistics (stats), nothing kept for backward
    memory_budget: int = 0  # bytes for temporaries; 0 = the backend's default
    inplace_backward: bool = False  # logprobs_from_logits: write grad_logits into the logits buffer
    need_grad_hidden: bool = True  # linear_logprobs_bwd may return None for a gradient that is not needed
    need_grad_weight: bool = True  # (grad_weight and grad_bias); e.g. a frozen LM head under LoRA

    @classmethod
    def with_head(cls, head: HeadOptions, **run: object) -> Options:
        """The head's fields (every one, by name) and the per-call fields in `run`."""
        return cls(**{name: getattr(head, name) for name in HEAD_FIELDS}, **run)


@runtime_checkable
class Backend(Protocol):
    """A backend module: four entry points (signatures in the module docstring), its devices, its availability."""

    DEVICE_TYPES: tuple[str, ...]  # device types it serves; "*" = any

    def is_available(self) -> tuple[bool, str]:
        """(True, "") when it can run here, else (False, why)."""
        ...

    def linear_logprobs_fwd(
        self, hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None, opts: Options
    ) -> tuple[Tensor, Tensor, Tensor]: ...

    def linear_logprobs_bwd(
        self, grad_logp: Tensor, grad_entropy: Tensor | None, hidden: Tensor, weight: Tensor, targets: Tensor,
        bias: Tensor | None, stats: Tensor, entropy: Tensor | None, opts: Options,
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]: ...

    def logprobs_from_logits_fwd(self, logits: Tensor, targets: Tensor, opts: Options) -> tuple[Tensor, Tensor, Tensor]:
        ...

    def logprobs_from_logits_bwd(
        self, grad_logp: Tensor, grad_entropy: Tensor | None, logits: Tensor, targets: Tensor, stats: Tensor,
        entropy: Tensor | None, opts: Options,
    ) -> Tensor: ...
