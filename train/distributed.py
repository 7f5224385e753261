"""Data-parallel training under torchrun: the process's place in the job (`Dist`) and the few collectives the trainer
needs. `torchrun --nproc_per_node N -m train ...` sets RANK / WORLD_SIZE / LOCAL_RANK; `python -m train` is a job
of one (every helper is then a no-op and nothing changes). gloo on CPU, nccl on CUDA. What is sharded and what is
replicated: docs/trainer.md, "More than one device"."""

from __future__ import annotations

import datetime
import gc
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from .errors import Refused, RefusedWithRank0, StoppedWithRank0, TrainError, report

T = TypeVar("T")


class PeerTimeout(TrainError):
    """A collective waited longer than --dist-timeout-s: a rank stopped answering (stopped, hung or dead)."""


class Heartbeat:
    """Each rank bumps its counter in the job's key-value store (a connection of its own to torchrun's store) every
    `interval` seconds from a daemon thread, so that after a collective timed out the ranks whose counter stands
    still can be named: a SIGSTOPped or dead process stops all of its threads."""

    def __init__(self, rank: int, world: int, timeout_s: float):
        self.rank, self.world = rank, world
        self.interval = max(0.2, min(5.0, timeout_s / 5))
        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        self.store = None
        if addr and port:
            try:
                wait = datetime.timedelta(seconds=max(2.0, 2 * self.interval))
                store = dist.TCPStore(addr, int(port), world, is_master=False, timeout=wait)
                self.store = dist.PrefixStore("sgrpo_heartbeat", store)
            except (RuntimeError, ValueError, OSError):  # no store to reach: the timeout message names no rank
                self.store = None
        self.stopped = threading.Event()
        if self.store is not None:
            threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def _beat(self) -> None:
        while not self.stopped.is_set():
            try:
                self.store.add(str(self.rank), 1)
            except (RuntimeError, OSError):
                return
            self.stopped.wait(self.interval)

    def silent_ranks(self) -> list[int] | None:
        """The other ranks whose counter did not move over three beats; None when the store cannot tell (it cannot
        be reached: its host, rank 0 outside torchrun, may be the one stopped)."""
        if self.store is None:
            return None
        try:
            others = [r for r in range(self.world) if r != self.rank]
            first = [self.store.add(str(r), 0) for r in others]
            time.sleep(3 * self.interval)
            return [r for r, n in zip(others, first) if self.store.add(str(r), 0) == n]
        except (RuntimeError, OSError):
            return None

    def stop(self) -> None:
        self.stopped.set()


def is_timeout(exc: BaseException) -> bool:
    """A collective (gloo, nccl, DDP's reducer) that gave up waiting for its peers."""
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("timed out" in text or "timeout" in text)


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    owns_group: bool = False  # this module initialized the default process group (and destroys it at the end)
    timeout_s: float = 300.0  # --dist-timeout-s: how long a collective waits for the other ranks
    heartbeat: Heartbeat | None = field(default=None, compare=False, repr=False)
    failed: list = field(default_factory=list, compare=False, repr=False)  # the PeerTimeout once one was raised

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def mean(self, t: Tensor) -> Tensor:
        """The mean over ranks of a tensor of the same shape on every rank (a copy; `t` itself when alone)."""
        if not self.enabled:
            return t
        t = t.detach().clone()
        self._wait(dist.all_reduce, t, op=dist.ReduceOp.SUM)
        return t / self.world

    def sum(self, t: Tensor) -> Tensor:
        """The sum over ranks of a tensor of the same shape on every rank (a copy; `t` itself when alone)."""
        if not self.enabled:
            return t
        t = t.detach().clone()
        self._wait(dist.all_reduce, t, op=dist.ReduceOp.SUM)
        return t

    def cat(self, t: Tensor) -> Tensor:
        """The ranks' tensors (same shape on every rank) concatenated along dim 0 in rank order."""
        if not self.enabled:
            return t
        parts = [torch.empty_like(t) for _ in range(self.world)]
        self._wait(dist.all_gather, parts, t.contiguous())
        return torch.cat(parts)

    def objects(self, obj) -> list:
        """Every rank's picklable `obj`, in rank order (plain data only: eval counts, RNG states)."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        self._wait(dist.all_gather_object, out, obj)
        return out

    def any(self, flag: bool) -> bool:
        """True when `flag` is true on some rank (one all-reduce)."""
        if not self.enabled:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        self._wait(dist.all_reduce, t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)

    def barrier(self) -> None:
        if self.enabled:
            self._wait(dist.barrier)

    def on_main(self, work: Callable[[], T]) -> T | None:
        """`work()` on rank 0 alone (the others get None), whose outcome every rank learns from one broadcast (so it
        is also a barrier: the others wait for rank 0's work). When `work` raises on rank 0, rank 0 prints a
        TrainError's message (before the others can exit: torchrun then stops the ranks still running), tells the
        others, and raises it; every other rank raises `StoppedWithRank0` with the message and exit status (a
        refusal's 2) instead of waiting in its next collective for a rank that is gone. A job of one: `work()`."""
        if not self.enabled:
            return work()
        if not self.is_main:
            outcome = self._share(None)
            if outcome is not None:
                what, code, reported = outcome
                stop = RefusedWithRank0 if code == Refused.exit_code else StoppedWithRank0
                raise stop(f"rank {self.rank}: stopped with rank 0, which {what}", code, reported)
            return None
        try:
            result = work()
        except BaseException as exc:
            known = isinstance(exc, TrainError)
            if known:
                report(exc)
            what = f"refused the run: {exc}" if isinstance(exc, Refused) else f"failed: {type(exc).__name__}: {exc}"
            try:  # the others are told when they can be; rank 0's own error is the one raised here
                self._share((what, exc.exit_code if known else 1, known))
            except (RuntimeError, TrainError):  # no other rank came to hear it: its timeout must not stand in for
                self.failed.clear()  # rank 0's error (train() raises a recorded PeerTimeout in place of what it got)
            raise
        self._share(None)
        return result

    def _share(self, outcome: tuple | None) -> tuple | None:
        """Rank 0's `outcome` on every rank (one broadcast of a small pickled object)."""
        box = [outcome]
        self._wait(dist.broadcast_object_list, box, src=0, device=self.device)
        return box[0]

    def _wait(self, collective, *args, **kwargs) -> None:
        """`collective(*args, **kwargs)`; its timeout becomes a PeerTimeout naming the silent ranks, and after one
        every later collective fails at once (the emergency checkpoint's included: the group is broken)."""
        if self.failed:
            raise self.failed[0]
        try:
            collective(*args, **kwargs)
        except RuntimeError as exc:
            error = self.timeout_error(exc)
            if error is None:
                raise
            raise error from None

    def timeout_error(self, exc: BaseException) -> PeerTimeout | None:
        """The PeerTimeout that explains `exc` when it is a collective's timeout (the first one, kept), else None."""
        if self.failed:
            return self.failed[0]
        if not self.enabled or not is_timeout(exc):
            return None
        silent = self.heartbeat.silent_ranks() if self.heartbeat is not None else None
        waited = f"rank {self.rank}: a collective waited longer than --dist-timeout-s {self.timeout_s:g}"
        if silent:
            who = ", ".join(f"rank {r}" for r in silent)
            msg = f"{waited}: {who} stopped answering (stopped, hung or dead: its heartbeat stands still)"
        elif silent is None:
            msg = f"{waited}: the job's store cannot be reached either (rank 0 or the torchrun agent stopped answering)"
        else:
            msg = (f"{waited}, yet every rank is alive: a rank's work between collectives took longer than that; "
                   "raise --dist-timeout-s")  # fmt: skip
        error = PeerTimeout(f"{msg} ({str(exc).strip().splitlines()[0][:200]})")
        self.failed.append(error)
        return error

    @property
    def device(self) -> torch.device:
        """Where this rank's collective buffers live: its GPU under nccl, else the CPU."""
        if self.enabled and dist.get_backend() == "nccl":
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")


ALONE = Dist()


def from_env(device: str, timeout_s: float = 300.0) -> Dist:
    """The job this process belongs to: torchrun's RANK / WORLD_SIZE / LOCAL_RANK (initializing the default process
    group: nccl when the run's device is CUDA, else gloo, whose collectives give up after `timeout_s`), or a job of
    one."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return ALONE
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(local_rank)
    owns = not dist.is_initialized()
    if owns:
        timeout = datetime.timedelta(seconds=timeout_s)
        try:
            dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world, timeout=timeout)
        except (RuntimeError, ValueError) as exc:  # DistStoreError is a RuntimeError: torch's traceback named no flag
            if not is_timeout(exc):
                raise
            raise PeerTimeout(f"rank {rank}: the job's {world} processes did not all join within --dist-timeout-s "
                              f"{timeout_s:g} (it is also init_process_group's timeout): a rank failed to start, or "
                              "started late on a busy machine; raise --dist-timeout-s") from exc
    beat = Heartbeat(rank, world, timeout_s)
    return Dist(rank=rank, world=world, local_rank=local_rank, owns_group=owns, timeout_s=timeout_s, heartbeat=beat)


def shutdown(ctx: Dist) -> None:
    """Destroy the process group this module created. Every DistributedDataParallel wrapper must be gone first: its
    reducer holds the group, and if the reducer is the last holder, freeing it later runs the gloo group's destructor
    with the GIL held; that destructor joins gloo's worker threads, and a worker still releasing a finished collective
    waits for the GIL: the process hangs at exit (seen in CI). The caller drops its references (train() clears the
    frames of a propagating exception); the collection here frees wrappers that only a reference cycle still holds."""
    if ctx.heartbeat is not None:
        ctx.heartbeat.stop()
    if ctx.owns_group and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
