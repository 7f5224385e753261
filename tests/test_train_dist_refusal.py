"""Under torchrun, a refusal that rank 0 alone makes (the output folder and its lock, a resume's checkpoint, claim's
held-out check) stops every rank at once with the refusal's exit status, and the message is printed once, by rank 0
(`Dist.on_main`). Before, the other ranks were left in their next collective: with gloo they failed when rank 0's
process closed its connections, with a traceback of gloo's "Connection closed by peer" and exit status 1; while rank
0's connections stayed open (NCCL's after a peer exits, or a caller that owns the process group) they waited
--dist-timeout-s and then blamed rank 0 for not answering."""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from conftest import tiny_cfg  # noqa: E402
from procs import free_port, init_gloo, spawn, wait_for  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FOREIGN = "which no run of this trainer wrote there"  # rank 0's refusal of a folder holding another tool's files
TIMEOUT_S = 20.0  # the group's and --dist-timeout-s; "at once" is judged as well under it (a loaded machine)


def _foreign_folder(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("another tool's metrics\n")
    return out


@pytest.mark.slow
def test_torchrun_refusal_by_rank0_stops_every_rank_with_its_message_once(tmp_path):
    out = _foreign_folder(tmp_path)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "train", "--model", "tiny", "--output-dir", str(out),
           "--prompts-per-step", "4", "--group-size", "4", "--max-new-tokens", "6", "--progress", "false",
           "--threads", "1", "--dist-timeout-s", str(int(TIMEOUT_S))]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    log = res.stdout + res.stderr
    assert res.returncode != 0, log[-3000:]
    assert log.count(FOREIGN) == 1, log[-3000:]  # rank 0's message, once
    # no rank's traceback (torchrun prefixes a worker's with [rankN]:), no gloo error, no timeout
    for word in ("[rank0]", "[rank1]", "Connection closed", "RuntimeError", "timed out", "--dist-timeout-s"):
        assert word not in log, (word, log[-3000:])
    # torchrun's report: the ranks' exit statuses, the refusal's 2 (a rank still exiting when torchrun stopped the job
    # on the first one's exit shows its SIGTERM, -15)
    codes = set(re.findall(r"exitcode\s*:\s*(-?\d+)", log))
    assert "2" in codes and codes <= {"2", "-15"}, log[-3000:]
    # nothing written (but for the lock file of a rank 0 that torchrun stopped on its way out, released by then)
    assert {p.name for p in out.iterdir()} <= {"metrics.jsonl", "train.lock"}, list(out.iterdir())
    assert (out / "metrics.jsonl").read_text() == "another tool's metrics\n"


def _train_rank(rank: int, world: int, port: int, out: str, case: str, results: str) -> None:
    """One rank of a job whose process group this process owns (train() then leaves it alone, as a script that calls
    train() itself would): rank 0 keeps its connections open after its refusal until rank 1 has stopped, as NCCL's
    stay open after a peer exits, so rank 1 learns of the refusal only from the trainer."""

    from train import loop
    from train.errors import Refused
    from train.run import rundir

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    init_gloo(rank, world, port, TIMEOUT_S)
    refused_at = []  # when rank 0 refused
    if case == "claim":  # a resume whose held-out problems changed: refused by rank 0 in setup, after DDP's wrap

        def claim(self, heldout):
            refused_at.append(time.time())
            raise Refused("--resume: the held-out problems differ (the test's refusal)")

        rundir.OutputDir.claim = claim
    else:
        real = loop.open_output_dir

        def open_output_dir(*args):
            try:
                return real(*args)
            except Refused:
                refused_at.append(time.time())
                raise

        loop.open_output_dir = open_output_dir
    result = _outcome(tiny_cfg(out, prompts_per_step=4, threads=1, dist_timeout_s=TIMEOUT_S))
    result["t"] = refused_at[0] if refused_at else time.time()  # rank 0: its refusal; rank 1: its stop
    _finish(rank, results, result, 3 * TIMEOUT_S)


def _outcome(cfg) -> dict:
    """train(cfg)'s outcome on this rank: its exception's type, exit status and message (type None: it finished)."""
    from train import loop

    try:
        loop.train(cfg)
        return {"type": None}
    except BaseException as exc:
        traceback.clear_frames(exc.__traceback__)
        return {"type": type(exc).__name__, "exit_code": getattr(exc, "exit_code", None), "message": str(exc)}


def _finish(rank: int, results: str, result: dict, wait_s: float) -> None:
    """Writes this rank's outcome; rank 0 keeps its connections open until rank 1 has written its own."""
    import torch.distributed as dist

    Path(results, f"rank{rank}.json").write_text(json.dumps(result))
    if rank == 0:
        wait_for(lambda: Path(results, "rank1.json").exists(), wait_s)
    gc.collect()
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["folder", "claim"])
def test_rank0_refusal_reaches_a_rank_waiting_for_it_at_once(tmp_path, case):
    """`folder`: rank 0 refuses the output folder (before the ranks first wait for each other); `claim`: rank 0's
    claim refuses a resume in setup (after the model is loaded and wrapped in DDP)."""
    out = _foreign_folder(tmp_path) if case == "folder" else tmp_path / "run"
    results = tmp_path / "results"
    results.mkdir()
    spawn(_train_rank, (2, free_port(), str(out), case, str(results)), nprocs=2, timeout=240)
    first, other = (json.loads((results / f"rank{r}.json").read_text()) for r in (0, 1))
    assert first["type"] == "Refused" and first["exit_code"] == 2, first
    assert other["type"] == "RefusedWithRank0" and other["exit_code"] == 2, other  # a Refused and a StoppedWithRank0
    assert other["message"].startswith("rank 1: stopped with rank 0, which refused the run: "), other
    assert first["message"] in other["message"], other
    waited = other["t"] - first["t"]
    print(f"{case}: rank 1 stopped {waited:.2f} s after rank 0's refusal")
    assert waited < TIMEOUT_S / 2, f"rank 1 stopped {waited:.1f} s after rank 0's refusal (timeout {TIMEOUT_S:g} s)"


LATE_TIMEOUT_S = 4.0


def _late_rank(rank: int, world: int, port: int, out: str, results: str) -> None:
    """Rank 1 reaches train() only after rank 0's refusal has waited --dist-timeout-s to tell it (a slow start)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    init_gloo(rank, world, port, LATE_TIMEOUT_S)
    if rank == 1:
        time.sleep(2.5 * LATE_TIMEOUT_S)
    result = _outcome(tiny_cfg(out, prompts_per_step=4, threads=1, dist_timeout_s=LATE_TIMEOUT_S))
    _finish(rank, results, result, 8 * LATE_TIMEOUT_S)


@pytest.mark.slow
def test_rank0_refusal_stands_when_no_rank_came_to_hear_it(tmp_path):
    """Telling the others timed out: rank 0 still raises its own refusal (exit 2), not the broadcast's timeout."""
    out = _foreign_folder(tmp_path)
    results = tmp_path / "results"
    results.mkdir()
    spawn(_late_rank, (2, free_port(), str(out), str(results)), nprocs=2, timeout=240)
    first = json.loads((results / "rank0.json").read_text())
    assert first["type"] == "Refused" and first["exit_code"] == 2, first
    assert "metrics.jsonl" in first["message"], first
    assert json.loads((results / "rank1.json").read_text())["type"] is not None


def test_a_refusal_by_rank_0_is_a_refused_on_every_rank():
    """`except Refused` catches it on the other ranks too (the world-size refusal was each rank's own Refused)."""
    from train.errors import Refused, RefusedWithRank0, StoppedWithRank0

    stop = RefusedWithRank0("rank 1: stopped with rank 0, which refused the run: ...", 2, True)
    assert isinstance(stop, Refused) and isinstance(stop, StoppedWithRank0) and stop.exit_code == 2
