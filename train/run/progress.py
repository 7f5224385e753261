"""Progress bars: a named tqdm bar for long phases, and the training bar with its ETA within a time budget."""

from __future__ import annotations

import math
import time


def progress_bar(show: bool, total: int, desc: str, initial: int = 0, leave: bool = False):
    """A named tqdm bar when `show`; None otherwise (every caller accepts None)."""
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, leave=leave)


def bar_total(max_steps: int, time_budget_s: float, start: int, step: int, elapsed: float) -> int:
    """The training bar's total: `max_steps`; with a time budget, the step at which the budget stops training at the
    pace so far when that comes first (a step starts while the budget is not spent), so the bar's ETA is the run's."""
    if not time_budget_s or step <= start:
        return max_steps
    left = time_budget_s - elapsed
    more = math.floor(left / (elapsed / (step - start))) + 1 if left >= 0 else 0
    return max(step, min(max_steps, step + more))


class TrainBar:
    """The training progress bar (tqdm, when `show`): reward, entropy, grad norm; ETA within the budget."""

    def __init__(self, show: bool, max_steps: int, time_budget_s: float, start: int, name: str):
        self.max_steps, self.time_budget_s, self.start, self.t0 = max_steps, time_budget_s, start, time.time()
        self.bar = progress_bar(show, max_steps, name, initial=start, leave=True)

    def step(self, record: dict) -> None:
        if self.bar is None:
            return
        self.bar.set_postfix(
            reward=f"{record['reward_mean']:.2f}",
            H=f"{record['entropy_mean']:.2f}",
            gn=f"{record['grad_norm']:.2f}",
            refresh=False,
        )
        elapsed = time.time() - self.t0
        self.bar.total = bar_total(self.max_steps, self.time_budget_s, self.start, record["step"], elapsed)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
