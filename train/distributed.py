"""Data-parallel training under torchrun: the process's place in the job (`Dist`) and the few collectives the trainer
needs. `torchrun --nproc_per_node N -m train ...` sets RANK / WORLD_SIZE / LOCAL_RANK; `python -m train` is a job
of one (every helper is then a no-op and nothing changes). gloo on CPU, nccl on CUDA. What is sharded and what is
replicated: docs/trainer.md, "More than one device"."""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    owns_group: bool = False  # this module initialized the default process group (and destroys it at the end)

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
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t / self.world

    def sum(self, t: Tensor) -> Tensor:
        """The sum over ranks of a tensor of the same shape on every rank (a copy; `t` itself when alone)."""
        if not self.enabled:
            return t
        t = t.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def cat(self, t: Tensor) -> Tensor:
        """The ranks' tensors (same shape on every rank) concatenated along dim 0 in rank order."""
        if not self.enabled:
            return t
        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts)

    def objects(self, obj) -> list:
        """Every rank's picklable `obj`, in rank order (plain data only: eval counts, RNG states)."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def any(self, flag: bool) -> bool:
        """True when `flag` is true on some rank (one all-reduce)."""
        if not self.enabled:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    @property
    def device(self) -> torch.device:
        """Where this rank's collective buffers live: its GPU under nccl, else the CPU."""
        if self.enabled and dist.get_backend() == "nccl":
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")


ALONE = Dist()


def from_env(device: str) -> Dist:
    """The job this process belongs to: torchrun's RANK / WORLD_SIZE / LOCAL_RANK (initializing the default process
    group: nccl when the run's device is CUDA, else gloo), or a job of one."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return ALONE
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(local_rank)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    return Dist(rank=rank, world=world, local_rank=local_rank, owns_group=owns)


def shutdown(ctx: Dist) -> None:
    """Destroy the process group this module created. Every DistributedDataParallel wrapper must be gone first: its
    reducer holds the group, and if the reducer is the last holder, freeing it later runs the gloo group's destructor
    with the GIL held; that destructor joins gloo's worker threads, and a worker still releasing a finished collective
    waits for the GIL: the process hangs at exit (seen in CI). The caller drops its references (train() clears the
    frames of a propagating exception); the collection here frees wrappers that only a reference cycle still holds."""
    if ctx.owns_group and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
