"""Checkpoints and the KL probe file, as plain tensors and containers only.

OUTPUT_DIR/checkpoint/state.pt holds one consistent state of a run: the trained weights, optimizer, scheduler, the RNG
states to continue from, every feature's state (`Feature.state_dict`, per rank), the step, the loop's bookkeeping
(which phases of that step are still to run, the metrics records written) and the configuration it was trained
with. OUTPUT_DIR/probe.pt holds the KL-from-init probe.

Both are read with `torch.load(weights_only=True)`: a file from the run directory is data, never code (a pickled
object in it is refused, not executed). Both are written atomically: to `NAME.tmp`, flushed to disk, then renamed over
the previous file, which stays intact until the new one is complete. `export_finished`: the model export at the end of
a finished, checkpointed run (train/export.py writes the folder), and what a signal or a full disk left.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import random
import re
import stat
import zipfile
from pathlib import Path

import torch
from torch import Tensor

from ..errors import TrainError
from ..export import MODEL_DIR, export_model, folder_mb
from ..run.files import NOFOLLOW, atomic_writer
from ..run.rng import is_random_state, restore_rng
from ..run.signals import signal_name

# of state.pt. Format 1 (pickles) and 2 (no feature states; the collapse history and the dynamic-sampling generator
# in the loop's state) are refused with a message that says so.
FORMAT = 3
STATE_FILE = "state.pt"
LOOP_KEYS = ("pending", "record", "before", "after", "finished", "log_lines", "stopped_by_time_budget")
# each held-out problem's outcomes; the rollout engine's name (a resume must roll out the same). Absent from
# checkpoints written before them
OPTIONAL_LOOP_KEYS = ("heldout", "rollout_engine")


class CheckpointError(TrainError):
    pass


def check_feature_states(states: dict) -> None:
    """CheckpointError unless each feature's state ({name: state}) loads back as --resume loads it (torch.load,
    weights_only): a state that cannot (a random.Random, any object) made a checkpoint that no resume could read.
    Checked at the run's start and at each save (a round trip of the states alone; the weights are not copied)."""
    for name, state in states.items():
        buf = io.BytesIO()
        try:
            torch.save(state, buf)
            buf.seek(0)
            torch.load(buf, weights_only=True)
        except Exception as exc:  # noqa: BLE001 -- pickling or the weights-only unpickler refusing a type
            found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))  # (torch's text: how to trust a file)
            why = f"it holds a {found.group(1)}" if found else f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            raise CheckpointError(
                f"feature {name!r}: state_dict() returned {state!r:.100}, which a checkpoint cannot hold for --resume "
                "(read with torch.load(weights_only=True): tensors, numbers, strings, lists, tuples and dicts only; "
                f"e.g. a random.Random as rng.getstate()): {why}"
            ) from None


# ----------------------------------------------------------------------------------------------------- files


def atomic_save(obj, file: Path) -> None:
    """torch.save to FILE.tmp, fsync, rename over FILE. On any failure the temporary file is removed and FILE is left
    as it was; an OSError (disk full, ...) becomes a CheckpointError that says so."""
    try:
        with atomic_writer(file, "wb", fsync=True) as f:  # our own FILE.tmp (never a link's target), renamed
            torch.save(obj, f)
    except BaseException as exc:
        if isinstance(exc, OSError):
            kept = f"the previous {file.name} is unchanged" if file.exists() else f"there is no {file.name}"
            raise CheckpointError(f"could not write {file}: {exc} ({kept})") from exc
        raise
    try:  # the rename itself on disk
        dir_fd = os.open(file.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:  # pragma: no cover -- platforms without directory fsync
        pass


def safe_load(file: Path, what: str) -> dict:
    """torch.load(weights_only=True) of a dict: tensors, numbers, strings, lists, tuples, dicts; anything else (a
    pickled object, a torn or foreign file) is a CheckpointError naming the file. Nothing in the file is executed."""
    # O_NONBLOCK: opening a FIFO for reading would wait for a writer forever; opened so, it is refused by fstat
    try:  # never through a symbolic link (a file under OUTPUT_DIR is read as it is)
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)  # FileNotFoundError: the caller's
    except OSError:
        if not os.path.islink(file):
            raise
        raise CheckpointError(f"{file} is a symbolic link: not read (the trainer never follows a link in its "
                              "output folder); put the file itself there") from None  # fmt: skip
    mode = os.fstat(fd).st_mode  # before fdopen, which refuses a folder with a bare "Is a directory: <fd>"
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else "a special file"
        raise CheckpointError(f"{file} is not a valid {what}: not a regular file ({kind}); nothing was read")
    with os.fdopen(fd, "rb") as f:
        return _load_dict(f, file, what)


def _torn(f) -> str | None:
    """Why `f` is an incomplete file, when it is one: empty, or a zip archive (what torch.save writes) cut short
    before its end record."""
    try:
        size = f.seek(0, os.SEEK_END)
        f.seek(0)
        head = f.read(4)
        cut = head == b"PK\x03\x04" and not zipfile.is_zipfile(f)
    except OSError:
        return None
    if size == 0:
        return "the file is empty"
    if cut or (len(head) < 4 and b"PK\x03\x04".startswith(head)):
        return f"the file ends after {size} bytes, before the end of its archive"
    return None


def _load_dict(f, file: Path, what: str) -> dict:
    try:
        obj = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 -- UnpicklingError, RuntimeError (torn zip), EOFError, OSError, ...
        torn = _torn(f)
        if torn is not None:
            raise CheckpointError(
                f"{file} is not a valid {what}: it is torn or incomplete ({torn}: a save or copy that did not "
                "complete); nothing was loaded"
            ) from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"{file} is not a valid {what} (only plain tensors and containers are read, nothing is executed): {first}"
        ) from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{file} is not a valid {what}: it holds a {type(obj).__name__}, not a dict")
    return obj


def _require(cond: bool, file: Path, what: str, problem: str) -> None:
    if not cond:
        raise CheckpointError(f"{file} is not a valid {what}: {problem}")


# ----------------------------------------------------------------------------------------------------- state.pt


def save_checkpoint(
    directory: Path,
    model,
    optimizer,
    scheduler,
    *,
    step: int,
    rngs: dict,
    loop: dict,
    cfg,
    loss_cfg,
    features: list[dict],
    world_size: int = 1,
    rank_rngs: list[dict] | None = None,
) -> Path:
    """Write directory/state.pt. Refuses (CheckpointError) to save a non-finite trained weight: the last good
    checkpoint stays. `features`: every rank's feature states, in rank order (one entry for a single process). A
    torchrun job saves its world size and every rank's RNG states (`rank_rngs`, in rank order; `rngs` is rank 0's)."""
    file = Path(directory) / STATE_FILE
    trainable = {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
    bad = [n for n, t in trainable.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise CheckpointError(
            f"refusing to save non-finite weights ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}) to "
            f"{file}; the last good checkpoint stays"
        )
    for states in features:
        check_feature_states(states)
    payload = {
        "format": FORMAT,
        "step": step,
        "trainable": trainable,  # full weights of trained layers, or the LoRA adapter; frozen ones are the base model
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rngs,
        "loop": _plain({k: loop[k] for k in LOOP_KEYS + OPTIONAL_LOOP_KEYS if k in loop}),
        "config": dataclasses.asdict(cfg),
        "loss_config": dataclasses.asdict(loss_cfg),
        "features": features,
        "world_size": world_size,
    }
    if rank_rngs is not None:
        payload["rank_rngs"] = rank_rngs
    Path(directory).mkdir(parents=True, exist_ok=True)
    atomic_save(payload, file)
    return file


def _plain(obj):
    """`obj` with every str subclass in it (a task's answer type) as a plain str: torch.load(weights_only=True) reads
    containers of builtin values back, and refuses (never runs) anything else."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_plain(v) for v in obj)
    return str(obj) if isinstance(obj, str) and type(obj) is not str else obj


def read_checkpoint(file: Path) -> dict:
    """Load and check state.pt (structure and types; weights_only). Raises FileNotFoundError or CheckpointError."""
    file, what = Path(file), "checkpoint of this trainer"
    ck = safe_load(file, what)
    _require(
        ck.get("format") == FORMAT,
        file,
        what,
        f"format {ck.get('format', 1)!r}, this trainer reads format {FORMAT} (format 1 held whole Python objects, "
        "format 2 kept no feature states; neither is loaded: start the run again)",
    )
    types = {
        "step": int,
        "trainable": dict,
        "optimizer": dict,
        "scheduler": dict,
        "rng": dict,
        "loop": dict,
        "config": dict,
        "loss_config": dict,
        "features": list,
    }
    for key, typ in types.items():
        _require(isinstance(ck.get(key), typ), file, what, f"{key!r} missing or not a {typ.__name__}")
    world = ck.setdefault("world_size", 1)  # checkpoints of a single process written before it was recorded
    _require(isinstance(world, int) and world >= 1, file, what, f"world_size {world!r} is not an int >= 1")
    if world > 1:
        ranks = ck.get("rank_rngs")
        ok = isinstance(ranks, list) and len(ranks) == world and all(isinstance(r, dict) for r in ranks)
        _require(ok, file, what, f"world_size {world} but no RNG states for each of its ranks")
    feats = ck["features"]
    ok = len(feats) == world and all(isinstance(f, dict) for f in feats)
    _require(ok, file, what, f"'features' must hold one dict of feature states per rank ({world})")
    _require(ck["step"] >= 0, file, what, "negative step")
    _require(
        all(isinstance(k, str) and isinstance(v, Tensor) for k, v in ck["trainable"].items()),
        file,
        what,
        "'trainable' must map names to tensors",
    )
    _check_progress(ck, file, what)
    rng = ck["rng"]
    _require(isinstance(rng.get("torch"), Tensor) and rng["torch"].dtype == torch.uint8, file, what, "bad torch RNG")
    _require(is_random_state(rng.get("task")), file, what, "bad task RNG state")
    cuda = rng.get("cuda")
    _require(cuda is None or (isinstance(cuda, list) and all(isinstance(t, Tensor) for t in cuda)), file, what, "cuda")
    loop = ck["loop"]
    _require(all(k in loop for k in LOOP_KEYS), file, what, f"'loop' lacks {[k for k in LOOP_KEYS if k not in loop]}")
    _require(
        isinstance(loop["pending"], list) and all(isinstance(p, str) for p in loop["pending"]), file, what, "pending"
    )
    _require(loop["record"] is None or isinstance(loop["record"], dict), file, what, "record")
    _require(isinstance(loop["log_lines"], int) and loop["log_lines"] >= 0, file, what, "log_lines")
    _require(_heldout_ok(loop.get("heldout")), file, what, "heldout")
    return ck


def _heldout_ok(h) -> bool:
    """None, or {"before": [outcome] | None, "after": [outcome] | None, "at": {"STEP": [outcome]}}, an outcome being
    a bool (checkpoints written before the greedy details were kept) or train.evaluate.heldout_eval's {"correct": bool,
    "extracted": str | None, "tokens": int, "hit_limit": bool}."""

    def outcome(x) -> bool:
        if isinstance(x, bool):
            return True
        return (isinstance(x, dict) and set(x) == {"correct", "extracted", "tokens", "hit_limit"}
                and isinstance(x["correct"], bool) and isinstance(x["hit_limit"], bool)
                and (x["extracted"] is None or isinstance(x["extracted"], str))
                and isinstance(x["tokens"], int) and not isinstance(x["tokens"], bool))  # fmt: skip

    def outcomes(v) -> bool:
        return v is None or (isinstance(v, list) and all(outcome(x) for x in v))

    if h is None:
        return True
    if not (isinstance(h, dict) and outcomes(h.get("before")) and outcomes(h.get("after"))):
        return False
    at = h.get("at", {})
    return isinstance(at, dict) and all(isinstance(k, str) and outcomes(v) for k, v in at.items())


def _finite_number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _check_progress(ck: dict, file: Path, what: str) -> None:
    """The step, the schedule and the optimizer state agree and hold finite numbers: a NaN in Adam's moments would
    make every later update non-finite (each one skipped), an absurd step would end the run at once."""
    step, sched, opt = ck["step"], ck["scheduler"], ck["optimizer"]
    last = sched.get("last_epoch")
    _require(
        isinstance(last, int) and last == step,
        file,
        what,
        f"'step' {step} and the schedule's step count (scheduler 'last_epoch' {last!r}) differ; the trainer "
        "advances both once a step",
    )
    for key in ("base_lrs", "_last_lr"):
        values = sched.get(key, [])
        ok = isinstance(values, list) and all(_finite_number(v) for v in values)
        _require(ok, file, what, f"scheduler {key!r} {values!r} is not a list of finite numbers")
    state, groups = opt.get("state"), opt.get("param_groups")
    _require(isinstance(state, dict) and isinstance(groups, list), file, what, "'optimizer' lacks state/param_groups")
    for i, group in enumerate(groups):
        _require(isinstance(group, dict), file, what, f"'optimizer' param_groups[{i}] is not a dict")
        for key, value in group.items():
            numbers = value if isinstance(value, list | tuple) and key != "params" else [value]
            bad = [v for v in numbers if isinstance(v, float) and not math.isfinite(v)]
            _require(not bad, file, what, f"'optimizer' param_groups[{i}] {key!r} is {value!r}")
    epochs = ck["config"].get("ppo_epochs", 1)
    for index, values in state.items():
        _require(isinstance(values, dict), file, what, f"'optimizer' state of parameter {index} is not a dict")
        for key, value in values.items():
            if not isinstance(value, Tensor):
                continue
            where = f"'optimizer' state of parameter {index}: {key!r}"
            _require(bool(torch.isfinite(value).all()), file, what, f"{where} holds non-finite values")
            if key == "step" and isinstance(epochs, int):
                n = float(value.max()) if value.numel() else 0.0
                _require(n <= step * epochs, file, what, f"{where} {n:g} > 'step' {step} x ppo_epochs {epochs}")


def restore_checkpoint(
    ck: dict,
    file: Path,
    model,
    optimizer,
    scheduler,
    task_rng: random.Random,
) -> None:
    """Put a `read_checkpoint` state into the model (trained weights, by name and shape), optimizer, scheduler and the
    RNGs."""
    what = "checkpoint for this model"
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    saved = ck["trainable"]
    _require(
        set(saved) == set(params),
        file,
        what,
        f"its trained parameters differ from this run's (missing {sorted(set(params) - set(saved))[:3]}, "
        f"unknown {sorted(set(saved) - set(params))[:3]})",
    )
    for name, value in saved.items():
        _require(value.shape == params[name].shape, file, what, f"{name} has shape {tuple(value.shape)}")
        _require(bool(torch.isfinite(value).all()), file, what, f"{name} holds non-finite values")
    try:
        with torch.no_grad():
            for name, value in saved.items():
                params[name].copy_(value)
        optimizer.load_state_dict(ck["optimizer"])
        scheduler.load_state_dict(ck["scheduler"])
        restore_rng(ck["rng"], task_rng)
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise CheckpointError(f"{file}: could not restore the run from it: {type(exc).__name__}: {exc}") from exc


# ----------------------------------------------------------------------------------------------------- probe.pt

PROBE_TENSORS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "rewards", "correct", "logp0")


def save_probe(file: Path, batch, logp0: Tensor) -> None:
    """The KL probe (a rollout `Batch` and its initial log-probs) as a dict of tensors and the list of texts."""
    payload = {"format": 1, "texts": list(batch.texts), "logp0": logp0.detach().cpu()}
    payload |= {k: getattr(batch, k).detach().cpu() for k in PROBE_TENSORS if k != "logp0"}
    atomic_save(payload, Path(file))


def load_probe(file: Path) -> dict:
    """-> {"texts": [...], "prompt_ids": ..., ..., "logp0": ...} on the CPU, checked; see `save_probe`."""
    file, what = Path(file), "KL probe file"
    pr = safe_load(file, what)
    _require(pr.get("format") == 1, file, what, f"format {pr.get('format')!r}")
    for k in PROBE_TENSORS:
        _require(isinstance(pr.get(k), Tensor), file, what, f"{k!r} missing or not a tensor")
    _require(isinstance(pr.get("texts"), list) and all(isinstance(t, str) for t in pr["texts"]), file, what, "texts")
    n, t = pr["completion_ids"].shape if pr["completion_ids"].dim() == 2 else (-1, -1)
    _require(n == len(pr["texts"]) and pr["completion_mask"].shape == (n, t), file, what, "inconsistent shapes")
    _require(pr["logp0"].shape == (n, t) and pr["completion_mask"].dtype == torch.bool, file, what, "logp0 / mask")
    return pr


def export_finished(model, tok, out_dir: Path) -> tuple[str | None, str | None]:
    """`export_model` at the end of a finished, checkpointed run -> (the signal that stopped it, or None; what went
    wrong, or None). A signal or an OSError (a full disk) leaves model/ as it was and says so; the run itself is saved
    (its checkpoint, metrics.jsonl, heldout.jsonl and the summary the caller writes)."""
    try:
        folder = export_model(model, tok, out_dir)
    except KeyboardInterrupt as exc:
        name = signal_name(exc)
        print(f"\n{name} while writing {Path(out_dir) / MODEL_DIR}: not written (the run is finished and "
              "checkpointed; --resume writes the model)")  # fmt: skip
        return name, None
    except OSError as exc:
        return None, (
            f"writing {Path(out_dir) / MODEL_DIR} failed ({exc.strerror or exc}); the previous model/ (if "
            "any) is unchanged. The run is finished and checkpointed: free space, then --resume writes it"
        )
    print(f"model: {folder} ({folder_mb(folder):.1f} MiB; AutoModelForCausalLM.from_pretrained loads it)")
    return None, None
