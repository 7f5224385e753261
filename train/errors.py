"""The trainer's own errors: `python -m train` prints their message (no traceback) and exits with `exit_code`."""

from __future__ import annotations


class TrainError(Exception):
    """A failure the user can act on (a checkpoint that cannot be read or written, weights gone non-finite)."""

    exit_code = 1


class Refused(TrainError):
    """The run was not started: its output directory, lock or --resume configuration says no (nothing was changed)."""

    exit_code = 2
