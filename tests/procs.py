"""Start a test's worker processes so that a hang fails the test instead of the suite: `spawn` is
`torch.multiprocessing.spawn` with a deadline, after which the workers are killed and the test fails, naming the
function and the seconds waited; `wait_for` polls for what another process does, with a deadline."""

from __future__ import annotations

import time

import pytest
import torch.multiprocessing as mp


def spawn(fn, args: tuple, nprocs: int, timeout: float = 300.0) -> None:
    """Run fn(rank, *args) in nprocs fresh processes and wait for all of them; a worker's exception is raised here
    (as torch.multiprocessing.spawn raises it); past `timeout` seconds every worker is killed and the test fails."""
    context = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not context.join(timeout=max(0.0, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for p in context.processes:
                if p.is_alive():
                    p.kill()
            for p in context.processes:
                p.join(10)
            pytest.fail(f"{fn.__name__}: {nprocs} processes did not finish within {timeout:.0f} s (killed)")


def wait_for(predicate, timeout_s: float) -> bool:
    """Whether `predicate()` became true within `timeout_s` seconds (polled every 50 ms, once more at the end)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()
