"""The tests' process helper (tests/procs.py): a worker that hangs fails its test by the deadline, the failure names the
ranks still running, and their stacks reach the test's stderr first (so a hang in CI says where it hung); a worker's
exception is raised as torch.multiprocessing.spawn raises it."""

from __future__ import annotations

import time

import pytest
import torch.multiprocessing as mp
from procs import spawn


def _rank1_hangs(rank: int, seconds: float) -> None:
    if rank == 1:
        time.sleep(seconds)


def _rank0_raises(rank: int) -> None:
    if rank == 0:
        raise ValueError("rank 0 gave up")


def test_a_hanging_worker_fails_the_test_with_its_stack(capfd):
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"_rank1_hangs: 2 processes did not finish within 12 s.*\[1\]"):
        spawn(_rank1_hangs, (300.0,), nprocs=2, timeout=12)
    assert time.monotonic() - start < 60  # killed at the deadline, not after the 300 s sleep
    err = capfd.readouterr().err
    assert "Timeout" in err and "in _rank1_hangs" in err, err[-2000:]  # faulthandler's dump of the hung rank


def test_a_workers_exception_is_raised():
    with pytest.raises(mp.ProcessRaisedException, match="rank 0 gave up"):
        spawn(_rank0_raises, (), nprocs=2, timeout=120)
