r"""A cap on the size of each optimizer step: the trust region on parameters.

After an optimizer step, the step :math:`d = \theta - \theta_{old}` of every tensor the optimizer updates, taken
together as one vector, is projected onto the Euclidean ball of radius :math:`\delta`:

.. math:: \theta \leftarrow \theta_{old} + d\,\min\!\big(1, \delta / \lVert d \rVert\big)

the closest point of the ball, which keeps the direction the optimizer chose (its moments stay as the step made
them). A step inside the ball is left untouched, and so is a non-finite one (a NaN or inf step is a step guard's job,
not a projection's); ``max_norm=inf`` only measures. The bundled trainer's ``--trust-region`` (docs/study.md: the
cap made reference-free GRPO better and stable) is this function.

The norm, accumulated in float64, is that of the whole step: under FSDP2 (DTensor parameters) the squared norms of
the local shards are summed over the mesh dimensions the parameter is sharded on; for shards that are plain tensors
(FSDP1 flat parameters, a hand-made split) pass ``process_group``. Under DDP every rank holds the same parameters
and takes the same step, so every rank measures the same norm and takes the same decision without communication.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from sgrpo_kernels.validation import check_flag

__all__ = ["TrustRegion", "TrustRegionStep", "project_step", "step_norm"]

_MAX_PASSES = 64  # strict mode: at most this many re-projections; the last resort is the zero step (inside the ball)


@dataclass(frozen=True)
class TrustRegionStep:
    """One optimizer step as the trust region saw it: ``norm`` (:math:`\\lVert d\\rVert` before the projection),
    ``norm_after`` (after it; ``norm`` when nothing was projected) and ``projected`` (whether the step was scaled)."""

    norm: float
    norm_after: float
    projected: bool


def check_max_norm(max_norm: object, name: str = "max_norm") -> float:
    """``max_norm``: a Python number > 0, or ``math.inf`` (measure only); NaN, 0, negatives and bools refused."""
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)):
        raise TypeError(f"{name} must be a Python number > 0 (or math.inf to only measure), got "
                        f"{type(max_norm).__name__} {max_norm!r}")
    v = float(max_norm)
    if math.isnan(v) or v <= 0:
        raise ValueError(f"{name} must be a number > 0 (the radius of the step's ball) or inf (measure only), "
                         f"got {max_norm!r}")
    return v


def _is_dtensor(t: Tensor) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "to_local")


def _local(t: Tensor) -> Tensor:
    """The tensor this rank holds: a DTensor's local shard (sharing its storage), else the tensor itself."""
    return t.to_local() if _is_dtensor(t) else t


def _shard_groups(t: Tensor) -> tuple:
    """The process groups a DTensor's local shard must be summed over (its mesh dimensions with a Shard placement);
    () for a plain tensor or a replicated DTensor. A Partial placement is refused: a parameter holds values."""
    if not _is_dtensor(t):
        return ()
    groups = []
    for dim, placement in enumerate(t.placements):
        if placement.is_shard():
            groups.append(t.device_mesh.get_group(dim))
        elif not placement.is_replicate():
            raise ValueError(f"TrustRegion: a parameter with placement {placement} (neither Shard nor Replicate) "
                             "has no whole value to measure")
    return tuple(groups)


@torch.no_grad()
def step_norm(params: Iterable[Tensor], old: Iterable[Tensor], *, process_group=None, exact: bool = False) -> float:
    """:math:`\\lVert \\theta - \\theta_{old}\\rVert` of all tensors taken together as one vector, accumulated in
    float64: the norm of each tensor's difference, then the norm of those norms. The difference is taken in the
    tensors' dtype (the bundled trainer's arithmetic: it rounds where the two values are far apart), or with
    ``exact=True`` in float64 (exact for float32 / bf16 / fp16 weights).
    ``old`` holds the local values (:meth:`TrustRegion.snapshot`); DTensor shards are summed over their sharded mesh
    dimensions, plain tensors over ``process_group`` when it is given (they are disjoint shards of the whole)."""
    params, old = list(params), list(old)
    if len(params) != len(old):
        raise ValueError(f"step_norm: {len(params)} params but {len(old)} old values")
    for i, (p, o) in enumerate(zip(params, old)):  # a broadcastable old (shape (1,)) gave a wrong norm, silently
        local = _local(p)
        if tuple(o.shape) != tuple(local.shape) or o.device != local.device:
            raise ValueError(f"step_norm: old[{i}] has shape {tuple(o.shape)} on {o.device}, expected "
                             f"{tuple(local.shape)} on {local.device} (params[{i}]'s local values, snapshot()'s)")
    if exact:
        norms = [torch.linalg.vector_norm(_local(p).detach().double() - o.double()) for p, o in zip(params, old)]
    else:
        norms = [torch.linalg.vector_norm(_local(p).detach() - o, dtype=torch.float64) for p, o in zip(params, old)]
    if not norms:
        return 0.0
    groups = [_shard_groups(p) for p in params]
    if process_group is not None:
        groups = [g if _is_dtensor(p) else (process_group,) for p, g in zip(params, groups)]
    if any(groups):
        norms = _reduce_shards(norms, groups)
    return float(torch.linalg.vector_norm(torch.stack(norms)))


def _reduce_shards(norms: list[Tensor], groups: list[tuple]) -> list[Tensor]:
    """Whole-tensor norms from per-shard ones: the squares summed over each tensor's groups, one all-reduce per
    distinct tuple of groups (usually one for the whole model)."""
    import torch.distributed as dist

    out = list(norms)
    buckets: dict[tuple, list[int]] = {}
    for i, g in enumerate(groups):
        if g:
            buckets.setdefault(tuple(id(x) for x in g), []).append(i)
    for idx in buckets.values():
        sq = torch.stack([norms[i] for i in idx]) ** 2
        for group in groups[idx[0]]:
            if sq.device.type == "cpu" or dist.get_backend(group) != "gloo":
                dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=group)
            else:  # gloo reduces host tensors only
                host = sq.cpu()
                dist.all_reduce(host, op=dist.ReduceOp.SUM, group=group)
                sq = host.to(sq.device)
        for j, i in enumerate(idx):
            out[i] = sq[j].sqrt()
    return out


@torch.no_grad()
def _scale_step(params: list[Tensor], old: list[Tensor], f: float) -> None:
    for p, o in zip(params, old):
        lp = _local(p)
        lp.copy_(o.lerp(lp, f))  # o + f * (p - o)


@torch.no_grad()
def project_step(
    params: Iterable[Tensor], old: Iterable[Tensor], max_norm: float, *, process_group=None, strict: bool = True
) -> TrustRegionStep:
    """Project the step of ``params`` from ``old`` (their local values before the optimizer step) onto
    :math:`\\lVert d\\rVert \\le` ``max_norm``, in place: :math:`\\theta \\leftarrow \\theta_{old} + f d`,
    :math:`f = \\delta / \\lVert d\\rVert`, computed in the weights' dtype (``lerp``).

    The projected step is inside the ball up to the rounding of the weights (half an ulp per weight). ``strict=True``
    (the default) measures exactly (differences in float64) and, while the rounding left the norm above ``max_norm``,
    projects again onto a slightly smaller ball (ever smaller; the zero step at worst), so that the applied step's
    norm, reported as ``norm_after``, is ``<= max_norm``. ``strict=False`` measures in the weights' dtype and projects
    once: the bundled trainer's ``--trust-region``, whose committed runs were made that way. A step inside the ball
    and a non-finite step are left untouched.
    """
    params, old = list(params), list(old)
    max_norm = check_max_norm(max_norm)
    check_flag("strict", strict)
    before = step_norm(params, old, process_group=process_group, exact=strict)
    if not math.isfinite(before) or before <= max_norm:
        return TrustRegionStep(before, before, False)
    _scale_step(params, old, max_norm / before)
    after = step_norm(params, old, process_group=process_group, exact=strict)
    passes = 0
    while strict and after > max_norm:
        passes += 1
        # aim inside by a margin that doubles each pass; the rounding error of a pass does not grow with it
        target = max_norm - (2.0**passes) * (after - max_norm)
        _scale_step(params, old, max(target, 0.0) / after if passes < _MAX_PASSES else 0.0)
        after = step_norm(params, old, process_group=process_group, exact=True)
    return TrustRegionStep(before, after, True)


def _checked(params: list) -> list[Tensor]:
    for i, p in enumerate(params):
        if not isinstance(p, Tensor) or not p.is_floating_point():
            raise TypeError(f"TrustRegion: params[{i}] must be a floating-point tensor, got "
                            f"{type(p).__name__} {getattr(p, 'dtype', '')}")  # fmt: skip
    return params


class TrustRegion:
    """The trust region on parameters of one optimizer (module docstring), attached through its step hooks.

    ::

        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        tr = sgrpo_kernels.rl.TrustRegion(opt, max_norm=0.1)
        ...
        opt.step()          # the step is projected onto ||theta - theta_old|| <= 0.1
        tr.last.norm, tr.last.norm_after, tr.last.projected

    Args:
        optimizer: any ``torch.optim.Optimizer``; its parameters (every param group, in order, read at each step:
            a group added later is capped too) are the step's vector unless ``params`` is given.
        max_norm: the radius :math:`\\delta > 0`; ``math.inf`` only measures.
        params: the tensors whose step is capped (default: the optimizer's); their order is the order of the norm's
            reduction.
        process_group: plain-tensor parameters are disjoint shards of the model over this group (FSDP1 flat
            parameters); DTensor parameters (FSDP2) need nothing.
        strict: see :func:`project_step` (``False``: one projection, the bundled trainer's arithmetic).
        attach: register the optimizer's step pre- and post-hooks (``False``: call :meth:`snapshot` before and
            :meth:`project` after each step yourself, e.g. around other after-step hooks).

    Attributes:
        last: the :class:`TrustRegionStep` of the last projected-or-measured step (None before the first one).
        steps, projected_steps: counts since construction.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, max_norm: float, *, params: Iterable[Tensor] | None = None,
                 process_group=None, strict: bool = True, attach: bool = True) -> None:  # fmt: skip
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"TrustRegion: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.max_norm = check_max_norm(max_norm)
        self.strict = check_flag("strict", strict)
        check_flag("attach", attach)
        self.optimizer = optimizer
        self._follow = params is None  # the optimizer's parameters as they are at each step (a group added later too)
        self.params = _checked(self._optimizer_params() if params is None else list(params))
        self.process_group = process_group
        self.old: list[Tensor] | None = None
        self.last: TrustRegionStep | None = None
        self.steps = 0
        self.projected_steps = 0
        self._handles = []
        if attach:
            self._handles = [optimizer.register_step_pre_hook(lambda *_: self.snapshot()),
                             optimizer.register_step_post_hook(lambda *_: self.project())]  # fmt: skip

    @torch.no_grad()
    def snapshot(self) -> None:
        """Copy the parameters' local values (:math:`\\theta_{old}`); called before each step."""
        if self._follow:
            self.params = _checked(self._optimizer_params())
        self.old = [_local(p).detach().clone() for p in self.params]

    def _optimizer_params(self) -> list[Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def project(self) -> TrustRegionStep:
        """Measure the step since :meth:`snapshot` and project it (module docstring); called after each step."""
        if self.old is None:
            raise RuntimeError("TrustRegion.project() without a snapshot() before the optimizer step")
        old, self.old = self.old, None
        self.last = project_step(self.params, old, self.max_norm, process_group=self.process_group,
                                 strict=self.strict)  # fmt: skip
        self.steps += 1
        self.projected_steps += int(self.last.projected)
        return self.last

    def discard(self) -> None:
        """Forget the snapshot (a step that was cut short or undone)."""
        self.old = None

    def remove(self) -> None:
        """Detach from the optimizer (its hooks removed; the snapshot dropped)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self.old = None
