"""The trainer's own errors: `python -m train` prints their message (no traceback) and exits with `exit_code`."""

from __future__ import annotations

import sys


class TrainError(Exception):
    """A failure the user can act on (a checkpoint that cannot be read or written, weights gone non-finite)."""

    exit_code = 1
    reported = False  # its message is on stderr already (`report`)


class Refused(TrainError):
    """The run was not started: its output directory, lock or --resume configuration says no (nothing was changed)."""

    exit_code = 2


class StoppedWithRank0(TrainError):
    """Under torchrun: rank 0 refused the run or failed in work that it alone does (the output folder and its lock,
    a resume's checkpoint, config.json), and this rank stops with it, with rank 0's exit status (`Dist.on_main`).
    `reported`: rank 0 printed the message (a TrainError's), so this rank prints nothing and the job says it once."""

    def __init__(self, message: str, exit_code: int, reported: bool):
        super().__init__(message)
        self.exit_code, self.reported = exit_code, reported


class RefusedWithRank0(StoppedWithRank0, Refused):
    """StoppedWithRank0 when rank 0 refused the run (exit 2): a Refused too, so `except Refused` catches it on every
    rank, as it caught the refusals that every rank made itself before they were made on rank 0 alone."""


def report(exc: TrainError) -> None:
    """`error: MESSAGE` on stderr, once per error (`python -m train`'s one line instead of a traceback)."""
    if not exc.reported:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        exc.reported = True
