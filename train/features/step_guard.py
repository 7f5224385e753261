"""The step guard (`--step-guard`, on by default): an optimizer step whose result is a non-finite weight (or that an
exception cut short) is rolled back to the weights and optimizer state from just before it, and the update counts it
as skipped; with `--step-guard false` such a step stops the run instead. Either way nothing non-finite is trained on
or saved. Always registered: the check runs in both modes."""

from __future__ import annotations

import torch

from ..errors import TrainError
from ..features.base import Feature


class StepGuard:
    """`take()` before `optimizer.step()` copies the trained parameters and their optimizer state (into buffers
    reused from step to step); `restore()` puts them back exactly; `non_finite()` names the parameters that hold a
    NaN or an infinity (one host sync)."""

    def __init__(self, named_params: list[tuple[str, torch.nn.Parameter]], optimizer: torch.optim.Optimizer):
        self.named_params = named_params
        self.optimizer = optimizer
        self._weights: list[torch.Tensor] | None = None
        self._state: list[dict | None] = []

    def take(self) -> None:
        with torch.no_grad():
            if self._weights is None:
                self._weights = [p.detach().clone() for _, p in self.named_params]
            else:
                for buf, (_, p) in zip(self._weights, self.named_params):
                    buf.copy_(p)
            old = self._state
            self._state = []
            for i, (_, p) in enumerate(self.named_params):
                st = self.optimizer.state.get(p)
                if not st:
                    self._state.append(None)  # no state yet (before the first step): restore removes it
                    continue
                prev = old[i] if i < len(old) and old[i] is not None else {}
                copy = {}
                for key, value in st.items():
                    if torch.is_tensor(value):
                        buf = prev.get(key)
                        if buf is None or buf.shape != value.shape or buf.dtype != value.dtype:
                            buf = value.detach().clone()
                        else:
                            buf.copy_(value)
                        copy[key] = buf
                    else:
                        copy[key] = value
                self._state.append(copy)

    def restore(self) -> None:
        if self._weights is None:
            raise RuntimeError("StepGuard.restore before take")
        with torch.no_grad():
            for buf, (_, p) in zip(self._weights, self.named_params):
                p.copy_(buf)
            for saved, (_, p) in zip(self._state, self.named_params):
                if saved is None:
                    self.optimizer.state.pop(p, None)
                else:
                    self.optimizer.state[p] = {k: v.clone() if torch.is_tensor(v) else v for k, v in saved.items()}

    def non_finite(self) -> list[str]:
        # Screen: a tensor's sum is NaN or infinite whenever one of its elements is, and a sum reads the tensor without
        # writing a mask as large; only a failed screen pays for the exact per-tensor check that names them.
        sums = torch.stack([p.detach().sum(dtype=torch.float64) for _, p in self.named_params])  # no overflow
        if bool(torch.isfinite(sums).all()):
            return []
        flags = torch.stack([torch.isfinite(p).all() for _, p in self.named_params])
        return [n for (n, _), ok in zip(self.named_params, flags.tolist()) if not ok]


class GuardFeature(Feature):
    name = "step_guard"

    def __init__(self, guard: StepGuard, enabled: bool):
        self.guard, self.enabled = guard, enabled

    def before_optimizer_step(self) -> None:
        if self.enabled:
            self.guard.take()

    def after_optimizer_step(self, which: str) -> str | None:
        bad = self.guard.non_finite()
        if not bad:
            return None
        names = ", ".join(bad[:3]) + (", ..." if len(bad) > 3 else "")
        if not self.enabled:
            raise TrainError(
                f"the optimizer step of {which} made {len(bad)} weight tensor(s) non-finite ({names}); stopping "
                "(--step-guard false). Nothing non-finite is saved."
            )
        self.guard.restore()
        return (
            f"the optimizer step made {len(bad)} weight tensor(s) non-finite ({names}): undone (weights and optimizer "
            "state restored)"
        )

    def undo_step(self, first: bool) -> bool:
        if self.enabled and first:  # cut short inside the batch's first step: undo it entirely
            self.guard.restore()
            return True
        return False


def from_run(cfg, run) -> GuardFeature:
    named = [(n, p) for n, p in run.model.named_parameters() if p.requires_grad]
    return GuardFeature(StepGuard(named, run.optimizer), cfg.step_guard)
