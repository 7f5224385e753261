"""The loop's state between phases (`LoopState`), and the checkpoint of it: `save`, `resume`, and `emergency_save`
on an interrupt or an error. What a checkpoint holds, and why that is enough for an exact resume: train/loop.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import Refused
from ..run.checkpoint import (
    LOOP_KEYS,
    STATE_FILE,
    CheckpointError,
    check_feature_states,
    restore_checkpoint,
    save_checkpoint,
)
from ..run.metrics import MetricsLog
from ..run.rng import restore_rng, rng_snapshot
from ..run.signals import STOP, signal_name

PHASES = ("before", "kl", "log", "eval", "save", "after")


@dataclass
class LoopState:
    """What the loop carries from phase to phase; a checkpoint saves all of it but the last two fields."""

    step: int  # steps committed
    rngs: dict  # the RNG states to continue from: after step `step`'s update (= the start of step `step + 1`)
    features: dict  # every feature's state after step `step` (Features.state_dict)
    pending: list[str]  # phases still to run (see PHASES), in order
    record: dict | None = None  # step `step`'s metrics record until its "log" phase writes it
    before: dict | None = None  # the held-out eval before training
    after: dict | None = None  # the held-out eval after training (of step `step` when `finished`)
    finished: bool = False  # "after" has run for `step`
    stopped_by_time_budget: bool = False
    # each held-out problem's greedy outcome: {"before": [bool] | None, "after": [bool] | None, "at": {"STEP": [bool]}}
    # (heldout.jsonl; evaluate.heldout_lines)
    heldout: dict = field(default_factory=lambda: {"before": None, "after": None, "at": {}})
    saved_step: int | None = None  # not saved: the step of the last checkpoint written (or resumed from)
    torn: bool = False  # not saved: an exception hit between an optimizer step and its commit; nothing to checkpoint


def fresh_state(run) -> LoopState:
    features = run.features.state_dict()
    check_feature_states(features)  # (a state no checkpoint can hold: refused now, not at the first save)
    return LoopState(step=0, rngs=rng_snapshot(run.task_rng), features=features, pending=["before"])


def commit(run, state: LoopState, record: dict, pending: list[str]) -> None:
    """The step counts: its number, the RNG and feature states after it, its record, the phases it has to run."""
    state.step += 1
    state.rngs = rng_snapshot(run.task_rng)
    state.features = run.features.state_dict()
    state.record = record
    state.pending = pending
    state.finished = state.stopped_by_time_budget = False


def resume(run, ckpt: dict) -> tuple[LoopState, int]:
    """--resume: weights, optimizer, scheduler, RNG states and the loop state from a `read_checkpoint` dict (already
    checked against the configuration by `open_output_dir`) -> (state, records of metrics.jsonl to keep)."""
    file = run.ckpt_dir / STATE_FILE
    loop = ckpt["loop"]
    was, now = loop.get("rollout_engine"), (run.engine.name if run.engine is not None else None)
    if was is not None and was != now:  # (--use-vllm auto fell back: the run would go on with another sampler)
        names = {"vllm": "vLLM", "hf": "HF generate"}
        raise Refused(
            f"--resume: the run rolled out with {names.get(was, was)} (its checkpoint {file} says so), this call with "
            f"{names.get(now, now)} (why: above); the resumed run would not be the run (other completions, no "
            "sampler log-probs or TIS). Resume where it can roll out as before, or start a new run"
        )
    unknown = [p for p in loop["pending"] if p not in PHASES]
    if unknown or (("kl" in loop["pending"] or "log" in loop["pending"]) and loop["record"] is None):
        raise CheckpointError(f"{file} is not a valid checkpoint of this trainer: pending phases {loop['pending']}")
    restore_checkpoint(ckpt, file, run.model, run.optimizer, run.scheduler, run.task_rng)
    rngs = ckpt["rng"]
    if run.dist.enabled:  # this rank's own sampling stream (the open_output_dir check made the world sizes equal)
        rngs = ckpt["rank_rngs"][run.dist.rank]
        restore_rng(rngs, run.task_rng)
    features = ckpt["features"][run.dist.rank]
    try:
        run.features.load_state_dict(features)
    except Refused:  # the features differ from the resumed run's
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{file}: could not restore the features' state: {exc}") from exc
    if run.engine is not None:
        run.engine.sync(run.model)
    state = LoopState(
        step=ckpt["step"], rngs=rngs, features=features, **{k: loop[k] for k in LOOP_KEYS if k != "log_lines"}
    )
    if loop.get("heldout") is not None:  # (a checkpoint written before heldout.jsonl existed has none)
        state.heldout = {"before": None, "after": None, "at": {}} | loop["heldout"]
    state.saved_step = state.step
    todo = f" (still to run for it: {', '.join(state.pending)})" if state.pending else ""
    print(f"resumed from step {state.step}{todo}")
    return state, loop["log_lines"]


def save(cfg, run, state: LoopState, log: MetricsLog) -> None:
    """Checkpoint the state. In a torchrun job every rank calls it (the RNG and feature states are gathered) and
    rank 0 writes (the weights and optimizer state are the same on every rank)."""
    loop = {k: getattr(state, k) for k in LOOP_KEYS if k != "log_lines"} | {"log_lines": log.lines}
    loop["heldout"] = state.heldout
    loop["rollout_engine"] = run.engine.name if run.engine is not None else None  # a resume must roll out the same
    rank_rngs = run.dist.objects(state.rngs) if run.dist.enabled else None
    features = run.dist.objects(state.features)
    if run.dist.is_main:
        log.sync()  # the records the checkpoint counts are on disk before it is (a power loss keeps both or neither)
        save_checkpoint(
            run.ckpt_dir,
            run.model,
            run.optimizer,
            run.scheduler,
            step=state.step,
            rngs=state.rngs,
            loop=loop,
            features=features,
            cfg=cfg,
            loss_cfg=run.loss_cfg,
            world_size=run.dist.world,
            rank_rngs=rank_rngs,
        )
    run.dist.barrier()
    state.saved_step = state.step


def emergency_save(cfg, run, state: LoopState, log: MetricsLog, exc: BaseException) -> None:
    """On an interrupt or an error: checkpoint the state when it is consistent; say what happened either way. A
    second signal during the save waits for it (then is dropped)."""
    what = signal_name(exc) if isinstance(exc, KeyboardInterrupt) else f"error ({type(exc).__name__})"
    last = f"the last checkpoint (step {state.saved_step}) stays" if state.saved_step is not None else "no checkpoint"
    if state.torn:
        print(f"\n{what} inside the optimizer update of step {state.step + 1}: nothing to save; {last}")
        return
    if isinstance(exc, CheckpointError):  # the save itself failed: its message says what is left
        return
    print(f"\n{what}: saving a checkpoint at step {state.step} (continue with --resume)")
    STOP.hold()
    try:
        save(cfg, run, state, log)
    except CheckpointError as err:
        print(f"checkpoint not saved: {err}")
        if isinstance(exc, KeyboardInterrupt):
            raise
    finally:
        STOP.release(raise_pending=False)
