"""Progress bars: a named tqdm bar for long phases, and the training bar with its ETA within a time budget. When
stderr is not a terminal (a log file, a pipe) they are plain lines instead: no carriage returns or cursor codes."""

from __future__ import annotations

import math
import sys
import time


class LineProgress:
    """tqdm's interface as used here (`update`, `set_postfix`, `total`, `close`) writing whole lines to stderr:
    "desc: n/total [elapsed<left, postfix]", at most one every `every` seconds, and the last one on close."""

    def __init__(self, total: int, desc: str, initial: int = 0, every: float = 10.0):
        self.total, self.desc, self.n, self.every = total, desc, initial, every
        self.start, self.initial, self.postfix, self.shown, self.last = time.time(), initial, "", initial, 0.0

    def set_postfix(self, refresh: bool = False, **values) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.time() - self.last >= self.every or self.n >= self.total:
            self._line()

    def _line(self) -> None:
        elapsed = time.time() - self.start
        done = self.n - self.initial
        left = f"<{_clock(elapsed / done * (self.total - self.n))}" if done > 0 and self.total > self.n else ""
        extra = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {self.n}/{self.total} [{_clock(elapsed)}{left}{extra}]", file=sys.stderr, flush=True)
        self.shown, self.last = self.n, time.time()

    def close(self) -> None:
        if self.n != self.shown:
            self._line()


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m:02d}:{s:02d}"


def progress_bar(show: bool, total: int, desc: str, initial: int = 0, leave: bool = False, every: float = 10.0):
    """A named tqdm bar when `show` (plain lines, at most one every `every` seconds, when stderr is not a terminal);
    None otherwise (every caller accepts None)."""
    if not show:
        return None
    if not sys.stderr.isatty():
        return LineProgress(total, desc, initial, every)
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
        self.show, self.name, self.bar = show, name, None

    def begin(self) -> None:
        """Training starts (its first step of this call): the bar appears and its clock starts, so the evaluation
        before training is not in its elapsed time and ETA. Later calls do nothing."""
        if self.bar is None and self.show:
            self.t0 = time.time()
            self.bar = progress_bar(True, self.max_steps, self.name, initial=self.start, leave=True, every=0.0)
            self.show = False  # once

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
