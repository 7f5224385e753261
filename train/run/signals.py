"""Ctrl-C (SIGINT) and SIGTERM stop a run the same way: as an exception that the loop catches to checkpoint the run.

`STOP` is installed for the length of `train()` (main thread only). Between `STOP.hold()` and `STOP.release()` (an
optimizer step and the bookkeeping that makes it count; the bookkeeping of each finished phase; an emergency save), a
signal is remembered instead of raised, and raised by `release()`: a checkpoint never sees half of an update.

In a torchrun job (`collective = True`) a signal is only ever remembered: the ranks agree at each phase boundary
(`pending_anywhere`) and stop together, so no rank leaves the others waiting inside a collective.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that one handler checkpoints both."""


SIGNAL_NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}
EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal number, as a shell reports a process killed by it


def signal_name(exc: BaseException) -> str:
    """The signal an interrupt stands for: SIGTERM for `Terminated`, SIGINT for any other KeyboardInterrupt."""
    return "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"


class StopSignals:
    def __init__(self) -> None:
        self._previous: dict = {}
        self._held = False
        self._pending: int | None = None  # a signal that arrived while held
        self.collective = False  # torchrun job: never raise from the handler or release(); see pending_anywhere

    def __enter__(self) -> StopSignals:
        self._held, self._pending, self.collective = False, None, False
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNAL_NAMES:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        self._held, self._pending = False, None

    @staticmethod
    def _exception(signum: int) -> KeyboardInterrupt:
        return Terminated("SIGTERM") if signum == signal.SIGTERM else KeyboardInterrupt()

    def _handle(self, signum, frame) -> None:
        if not self._held and not self.collective:
            raise self._exception(signum)
        if self._pending is None:
            print(f"\n{SIGNAL_NAMES[signum]}: stopping as soon as this is recorded", file=sys.stderr, flush=True)
        self._pending = signum

    def hold(self) -> None:
        self._held = True

    @contextmanager
    def held(self):
        """`hold()` for the block; a signal that came meanwhile is raised at its end (not when the block raised)."""
        self.hold()
        try:
            yield
        except BaseException:
            self.release(raise_pending=False)
            raise
        self.release()

    def release(self, raise_pending: bool = True) -> None:
        """Lets signals through again; raises the one that came while held (unless `raise_pending` is False, on the
        way out of another exception: that one is already stopping the run)."""
        self._held = False
        if self.collective:  # kept for the next phase boundary
            return
        signum, self._pending = self._pending, None
        if signum is not None and raise_pending:
            raise self._exception(signum)

    def stop_together(self, any_rank) -> None:
        """Collective mode, at a phase boundary on every rank: when a signal reached any rank (`any_rank(flag)`: one
        all-reduce), every rank raises (SIGTERM's exception unless this rank got a SIGINT)."""
        if self.collective and any_rank(self._pending is not None):
            signum, self._pending = self._pending, None
            raise self._exception(signum if signum is not None else signal.SIGTERM)


STOP = StopSignals()
