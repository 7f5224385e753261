"""The tests' process helper (tests/procs.py): a worker that hangs fails its test by the deadline and the failure names
the ranks still running; a worker still running near the deadline prints its stacks to stderr first (so a hang in CI
says where it hung); a worker's exception is raised as torch.multiprocessing.spawn raises it."""

from __future__ import annotations

import time

import pytest
import torch
import torch.multiprocessing as mp
from procs import _traced, spawn, spawn_gloo

_KEPT = []


def _rank1_hangs(rank: int, seconds: float) -> None:
    if rank == 1:
        time.sleep(seconds)


def _rank0_raises(rank: int) -> None:
    if rank == 0:
        raise ValueError("rank 0 gave up")


def test_a_hanging_worker_fails_the_test_by_its_deadline():
    start = time.monotonic()
    # rank 1 sleeps past the deadline; rank 0 returns at once, unless the machine is so loaded that it has not even
    # started by then (seen in a clean-clone CI run beside two study runs: a worker's start-up took over 12 s)
    with pytest.raises(
        pytest.fail.Exception, match=r"_rank1_hangs: 2 processes did not finish within 8 s.*\[(0, )?1\]"
    ):
        spawn(_rank1_hangs, (300.0,), nprocs=2, timeout=8)
    assert time.monotonic() - start < 60  # killed at the deadline, not after the 300 s sleep


def test_a_worker_still_running_at_its_dump_time_prints_its_stack(capfd):
    _traced(1, _rank1_hangs, time.time() + 0.5, 1.5)  # (in this process: what a spawned worker runs)
    err = capfd.readouterr().err
    assert "Timeout" in err and "in _rank1_hangs" in err, err[-2000:]  # faulthandler's dump, from inside fn
    _traced(1, _rank1_hangs, time.time() + 0.5, 0.0)  # finished in time: the dump is cancelled
    time.sleep(1.0)
    assert "Timeout" not in capfd.readouterr().err


def test_a_workers_exception_is_raised():
    with pytest.raises(mp.ProcessRaisedException, match="rank 0 gave up"):
        spawn(_rank0_raises, (), nprocs=2, timeout=120)


def _keeps_its_ddp_wrapper(rank: int, world: int) -> None:
    _KEPT.append(torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2)))


def _raises_with_a_ddp_wrapper(rank: int, world: int) -> None:
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))  # noqa: F841 (held by the frame)
    raise ValueError(f"rank {rank} of {world} gave up")


def test_a_ddp_wrapper_that_outlives_the_worker_fails_it_before_the_group_is_destroyed():
    # a wrapper freed after destroy_process_group can hang the process at exit (procs.spawn_gloo): refused, named
    refused = (mp.ProcessRaisedException, pytest.fail.Exception)  # (the latter if the process then hung at its exit)
    with pytest.raises(refused, match=r"_keeps_its_ddp_wrapper \(rank 0\) left \['DistributedDataParallel'\] alive"):
        spawn_gloo(_keeps_its_ddp_wrapper, (), nprocs=1, timeout=120)


def test_a_failing_worker_s_frames_do_not_keep_its_wrapper_alive():
    # the error is the worker's own, not the check's: its frames were cleared, the wrapper freed, the group destroyed
    with pytest.raises(mp.ProcessRaisedException, match="rank 0 of 1 gave up") as info:
        spawn_gloo(_raises_with_a_ddp_wrapper, (), nprocs=1, timeout=120)
    assert "alive" not in str(info.value)
