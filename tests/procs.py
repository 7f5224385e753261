"""Start a test's worker processes so that a hang fails the test instead of the suite: `spawn` is
`torch.multiprocessing.spawn` with a deadline, after which the workers are killed and the test fails, naming the
function, the seconds waited and the ranks still running, each of which first printed its threads' stacks (to the
test's captured stderr); `init_gloo` joins a worker to a gloo group on 127.0.0.1 whose own timeout comes before that
deadline, so a collective that waits forever fails with gloo's message; `free_port` a port for it; `spawn_gloo` is
`spawn` with each worker in such a group, destroyed only once nothing the worker made still holds it; `wait_for` polls
for what another process does, with a deadline."""

from __future__ import annotations

import datetime
import faulthandler
import gc
import os
import pickle
import socket
import time
import traceback

import pytest
import torch.multiprocessing as mp

# A gloo group's timeout (init_gloo); spawn's deadline must leave room for it and for the workers' start-up.
GLOO_TIMEOUT_S = 120.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_gloo(rank: int, world: int, port: int, timeout_s: float = GLOO_TIMEOUT_S) -> None:
    """This worker joins a gloo process group on the loopback interface (no host-name lookup) with one CPU thread;
    a collective that waits longer than `timeout_s` raises instead of hanging."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))


def _traced(rank: int, fn, dump_at: float, *args) -> None:
    """fn(rank, *args), and if it is still running at `dump_at` (time.time(); at least half a second after it starts:
    a worker slow to start still prints before it is killed), every thread's stack on stderr."""
    faulthandler.dump_traceback_later(max(0.5, dump_at - time.time()), exit=False)
    try:
        fn(rank, *args)
    finally:
        faulthandler.cancel_dump_traceback_later()


def spawn(fn, args: tuple, nprocs: int, timeout: float = 300.0) -> None:
    """Run fn(rank, *args) in nprocs fresh processes and wait for all of them; a worker's exception is raised here
    (as torch.multiprocessing.spawn raises it); past `timeout` seconds every worker is killed and the test fails (the
    ones still running print their stacks 10 s before; the failure quotes the error of a worker that raised and then
    hung at its exit)."""
    dump_at = time.time() + max(1.0, timeout - 10.0)  # the same moment for every worker, however late it starts
    context = mp.start_processes(_traced, args=(fn, dump_at, *args), nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not context.join(timeout=max(0.0, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            alive = [r for r, p in enumerate(context.processes) if p.is_alive()]
            for p in context.processes:
                if p.is_alive():
                    p.kill()
            for p in context.processes:
                p.join(10)
            errors = {r: _error(f) for r, f in enumerate(context.error_files)}
            raised = "".join(f"\nrank {r} raised before it hung:\n{e}" for r, e in errors.items() if e)
            pytest.fail(
                f"{fn.__name__}: {nprocs} processes did not finish within {timeout:.0f} s (killed); ranks still "
                f"running: {alive} (their stacks are in the captured stderr){raised}"
            )


def spawn_gloo(fn, args: tuple, nprocs: int, timeout: float = 300.0) -> None:
    """`spawn` of fn(rank, world, *args) in `nprocs` workers, each a rank of one gloo group (`init_gloo`, world =
    nprocs). The group is destroyed after fn returned or raised, once every object fn made is gone: fn's locals die
    with its frame, a failure's frames are cleared, and reference cycles are collected. A DistributedDataParallel
    wrapper or FSDP module still alive then (a global, a returned object) fails the worker before the destruction:
    one that outlives its group frees the gloo group later, from its reducer with the GIL held, and that destructor
    joins gloo's threads while one of them waits for the GIL, so the process hangs at exit (train.distributed.shutdown;
    CI hung so twice, in test_ddp_every_rank_takes_the_same_decision)."""
    spawn(_in_gloo, (fn, nprocs, free_port(), *args), nprocs=nprocs, timeout=timeout)


def _in_gloo(rank: int, fn, world: int, port: int, *args) -> None:
    import torch.distributed as dist

    init_gloo(rank, world, port)
    try:
        fn(rank, world, *args)
    except BaseException as exc:
        traceback.clear_frames(exc.__traceback__)  # a failure's frames would keep fn's wrappers alive
        raise
    finally:
        gc.collect()
        held = _wrappers_alive()
        if held:
            raise RuntimeError(
                f"{fn.__name__} (rank {rank}) left {held} alive after it returned: it would free the gloo group after "
                "its destruction and can hang the process at exit; keep it local to the function"
            )
        dist.destroy_process_group()


def _wrappers_alive() -> list[str]:
    """The DistributedDataParallel wrappers and FSDP modules alive in this process (each holds its process group)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    return sorted(type(o).__name__ for o in gc.get_objects() if isinstance(o, (DistributedDataParallel, FSDPModule)))


def _error(path: str) -> str:
    """The traceback a spawned worker wrote to its error file (torch.multiprocessing.spawn's _wrap), or ''."""
    try:
        with open(path, "rb") as fh:
            return pickle.load(fh)
    except (OSError, EOFError, pickle.UnpicklingError):
        return ""


def wait_for(predicate, timeout_s: float) -> bool:
    """Whether `predicate()` became true within `timeout_s` seconds (polled every 50 ms, once more at the end)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()
