"""The run loop. Read `train()` at the bottom first; one step is train/step.py.

A run is a sequence of phases. Step k (`train_step`: rollout -> rewards -> advantages -> loss -> backward ->
optimizer step -> record) ends with its *commit*: from then on the state says "k steps done", with the RNG and
feature states after step k and the step's phases still to run, in this order, each when due: "kl" (the
KL-from-init probe), "log" (the step's metrics record), "eval" (periodic held-out eval), "save" (checkpoint). Before
step 1 runs "before" (held-out eval); after the last step "save", "after" (held-out eval), "save".

A checkpoint holds that state as one consistent tuple (step, RNG and feature states, weights, optimizer, pending
phases, records written). Each phase does its work first (interruptible: it stays pending) and then, with signals held
(train/run/signals.py), its bookkeeping; an optimizer step holds signals until its commit. So a Ctrl-C or SIGTERM
anywhere saves a state that `--resume` continues exactly as the uninterrupted run would have gone on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import traceback

from .batch import Update
from .config import TrainConfig
from .distributed import Dist, from_env, shutdown
from .errors import Refused, TrainError
from .evaluate import HELDOUT_FILE, compare_heldout, heldout_eval, write_heldout
from .model import mixed_precision, resolve_device
from .probe import kl_from_init
from .record import reset_train_peak
from .rewards import RewardError, RewardFunctions
from .run.checkpoint import STATE_FILE, export_finished, read_checkpoint
from .run.dashboards import dashboard_backend
from .run.files import expand_output_dir, output_path
from .run.lock import RunLock
from .run.metrics import MetricsLog, NullLog, write_json
from .run.progress import TrainBar
from .run.rundir import OutputDir, drop_exported_model, open_output_dir
from .run.signals import STOP, signal_name
from .run.state import LoopState, commit, emergency_save, fresh_state, resume, save
from .setup import Run, setup
from .step import train_step


def post_step_phases(cfg: TrainConfig, step: int) -> list[str]:
    """The phases due after step `step`'s optimizer step, in order."""
    phases = ["kl"] if cfg.kl_every and (step % cfg.kl_every == 0 or step == cfg.max_steps) else []
    phases.append("log")
    if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.max_steps:  # the last step has the final eval
        phases.append("eval")
    if cfg.save_every and step % cfg.save_every == 0:
        phases.append("save")
    return phases


def add_time(record: dict, name: str | None, seconds: float) -> None:
    """Work done for step `record` after its record was made (the engine's weight sync, the KL probe) joins its
    `step_s` (and `tokens_per_s` falls to match); `name`: the record's own field for that time, if any."""
    record["tokens_per_s"] *= record["step_s"] / (record["step_s"] + seconds)
    record["step_s"] += seconds
    if name is not None:
        record[name] = seconds


def run_step(cfg: TrainConfig, run: Run, state: LoopState) -> None:
    """Step `state.step + 1` and its commit (signals held from its first optimizer step to the commit); then the
    rollout engine takes the new weights."""
    update = Update()
    try:
        record = train_step(run, state.step + 1, update)
    except BaseException:
        STOP.release(raise_pending=False)
        state.torn = update.applied  # an optimizer step was applied but cannot be counted
        raise
    commit(run, state, record, post_step_phases(cfg, state.step + 1))
    try:
        for note in update.notes:
            print(f"step {state.step}: update skipped, {note}")
        if run.engine is not None:  # after the commit: a failure here leaves a state that can be checkpointed
            t = time.time()
            run.engine.sync(run.model)
            add_time(record, "sync_s", time.time() - t)  # the step's cost: its record is not written yet
    except BaseException:
        STOP.release(raise_pending=False)
        raise
    STOP.release()  # a Ctrl-C / SIGTERM that came during the update stops the run now, with the step counted


def run_phase(cfg: TrainConfig, run: Run, state: LoopState, log: MetricsLog, bar: TrainBar) -> None:
    """Runs the first pending phase: its work (interruptible: the phase stays pending, a resume runs it again), then,
    with signals held, its bookkeeping (so a checkpoint sees the phase either done or not done)."""
    phase = state.pending[0]
    if phase == "save":
        state.pending.pop(0)  # the checkpoint it writes has it done (a failed save is reported, the old one stays)
        save(cfg, run, state, log)
        return
    t = time.time()
    result = correct = None
    if phase == "kl" and run.probe is not None:  # (no probe: --kl-every 0 on a resume; nothing to measure)
        result = kl_from_init(run.model, run.probe, run.sampling.temperature, run.backend)
    elif phase == "after" and state.step == 0 and state.before is not None and state.heldout["before"] is not None:
        result, correct = unchanged_after(state)
    elif phase in ("before", "eval", "after"):
        result, correct = heldout_eval(cfg, run, state.step, phase if phase != "eval" else None)
    with STOP.held():
        rec = state.record
        if phase == "kl":
            rec["kl_from_init"] = result
            add_time(rec, None, time.time() - t)  # the probe's time is part of the step's
        elif phase == "log":
            log.write(rec)
            state.record = None
            bar.step(rec)
        else:
            log.write(result)
            ev = {k: v for k, v in result.items() if k not in ("step", "event")}
            if phase == "before":
                state.before = ev
            elif phase == "after":
                state.after, state.finished = ev, True
            record_outcomes(run, state, phase, correct)
        state.pending.pop(0)


def unchanged_after(state: LoopState) -> tuple[dict, list[dict]]:
    """The "after" evaluation of a run that took no step (`--max-steps 0`, or a time budget spent before the first):
    the weights are those "before" evaluated, so its record and outcomes are "before"'s, not a second evaluation."""
    ev = state.before
    print(f"held-out after:  acc {ev['eval_acc']:.3f} +- {ev['eval_acc_se']:.3f} (n={ev['eval_n']}; no step was taken: "
          "the weights evaluated before, not evaluated again)")  # fmt: skip
    return {"step": 0, "event": "eval", **ev}, list(state.heldout["before"])


def record_outcomes(run: Run, state: LoopState, phase: str | None = None, correct: list[bool] | None = None) -> None:
    """The per-problem outcomes of the evaluation `phase` ("before", "eval", "after") into the state, then
    OUTPUT_DIR/heldout.jsonl rewritten from the state (rank 0; atomically): the file says what the state, and so its
    next checkpoint, holds (a resume rewrites it from the checkpoint's)."""
    if phase == "eval":
        state.heldout["at"][str(state.step)] = correct
    elif phase in ("before", "after"):
        state.heldout[phase] = correct
    if run.dist.is_main:
        write_heldout(run.out_dir / HELDOUT_FILE, run.heldout, state.heldout)


def over_budget(cfg: TrainConfig, state: LoopState, t_train: float) -> bool:
    if not cfg.time_budget_s or time.time() - t_train <= cfg.time_budget_s:
        return False
    if not state.stopped_by_time_budget:
        print(f"\ntime budget of {cfg.time_budget_s:.0f}s reached after {state.step} steps")
        state.stopped_by_time_budget = True
    return True


def run_to_end(cfg: TrainConfig, run: Run, state: LoopState, log: MetricsLog, bar: TrainBar) -> None:
    """Pending phases first, then steps until `max_steps` or the time budget, then the final phases."""
    t_train = time.time()
    while True:
        STOP.stop_together(run.dist.any)  # torchrun job: a signal on any rank stops every rank here, together
        if state.pending:
            run_phase(cfg, run, state, log, bar)
        elif state.step < cfg.max_steps and not run.dist.any(over_budget(cfg, state, t_train)):
            bar.begin()  # the bar's clock starts with training, after the evaluation before it
            run_step(cfg, run, state)
        elif not state.finished:  # training is over: checkpoint it (unless just done), the final eval, checkpoint
            state.pending = (["save"] if state.saved_step != state.step else []) + ["after", "save"]
        else:
            return


def write_summary(cfg: TrainConfig, run: Run, state: LoopState, stopped_by: str | None, t_start: float) -> dict:
    summary: dict = {"output_dir": str(run.out_dir), "preset": run.loss_cfg.name, "model": cfg.model}
    if state.before is not None:
        summary["before"] = state.before
    summary["steps"] = state.step
    if state.finished:
        summary["after"] = state.after
        if state.before is not None:
            compare_heldout(summary)
    if state.stopped_by_time_budget:
        summary["stopped_by_time_budget"] = True
    summary["wall_s"] = time.time() - t_start
    summary["interrupted"] = stopped_by is not None
    summary["signal"] = stopped_by
    summary["world_size"] = run.dist.world
    if run.dist.is_main:
        try:
            write_json(run.out_dir / "summary.json", summary, indent=2)
        except OSError as exc:  # a full disk: the message says what is saved, not a traceback
            saved = ("not checkpointed" if state.saved_step is None else "finished and checkpointed" if state.finished
                     else f"checkpointed at step {state.saved_step}")  # fmt: skip
            raise TrainError(
                f"{run.out_dir / 'summary.json'} could not be written ({exc.strerror or exc}); the run is {saved}, "
                "its records in metrics.jsonl: free space and run the same command with --resume to write it"
            ) from None
    return summary


def check_world(cfg: TrainConfig, ctx: Dist) -> None:
    if cfg.prompts_per_step % ctx.world:
        raise Refused(
            f"--prompts-per-step {cfg.prompts_per_step} cannot be split into whole groups over {ctx.world} processes: "
            f"use a multiple of {ctx.world} (each rank rolls out prompts_per_step / {ctx.world} prompts)"
        )


def open_checkpoint(
    cfg: TrainConfig, loss_cfg, ctx: Dist, held: contextlib.ExitStack
) -> tuple[dict | None, OutputDir | None]:
    """Rank 0 locks the output directory (until `held` closes) and checks it: the checkpoint to resume from (checked
    against the configuration and the job's size), or None for a fresh run; and on rank 0 the checked folder, whose
    `claim` (called by setup, once nothing can refuse the run) makes it this run's (--overwrite deletes the previous
    run only then). Every rank waits for rank 0's checks and learns their outcome (`Dist.on_main`): a refusal there
    stops every rank at once, with its exit status."""

    def check() -> OutputDir:
        held.enter_context(RunLock(cfg.output_dir))
        opened = open_output_dir(cfg, loss_cfg)  # refuses a mix of runs; --resume: checked
        if opened.ckpt is not None and opened.ckpt["world_size"] != ctx.world:
            raise Refused(
                f"--resume: {cfg.output_dir} was trained by {opened.ckpt['world_size']} process(es), this job has "
                f"{ctx.world}: resume with the same number (torchrun --nproc_per_node {opened.ckpt['world_size']})"
            )
        return opened

    opened = ctx.on_main(check)
    ckpt = opened.ckpt if opened is not None else None
    if cfg.resume and not ctx.is_main:
        ckpt = read_checkpoint(output_path(cfg.output_dir) / "checkpoint" / STATE_FILE)
    return ckpt, opened


def drop_stale_model(run: Run, state: LoopState, resumed: tuple[int, bool] | None, why: str) -> None:
    """A resumed run that stops without writing its model/ (`why`), where model/ may be an earlier finish's:
    `resumed`, the checkpoint's (step, finished) (None: no resume that went on). Unless the state is still that
    finished checkpoint's, model/ is not the run's policy and is removed (rundir.drop_exported_model); a signal
    meanwhile waits for it, then is dropped."""
    if resumed is None or (state.finished and resumed == (state.step, True)):
        return
    STOP.hold()
    try:
        drop_exported_model(run.out_dir, why)
    finally:
        STOP.release(raise_pending=False)


def train_to_end(cfg: TrainConfig, run: Run, state: LoopState, log: MetricsLog, bar: TrainBar, resumed) -> str | None:
    """`run_to_end`; on a Ctrl-C or SIGTERM the run is checkpointed and the signal's name returned (None: it ran to
    its end), on any other exception checkpointed and the exception raised. A resumed run that stops so leaves no
    model/ of an earlier finish (`drop_stale_model`)."""
    try:
        run_to_end(cfg, run, state, log, bar)
    except BaseException as exc:
        bar.close()
        emergency_save(cfg, run, state, log, exc)
        drop_stale_model(run, state, resumed, f"stopped at step {state.step} before its finish")
        if not isinstance(exc, KeyboardInterrupt):
            raise
        return signal_name(exc)
    finally:
        bar.close()
    return None


def _train(cfg: TrainConfig, loss_overrides: dict | None, model_and_tokenizer, ctx: Dist, t_start: float) -> dict:
    if not ctx.is_main:
        cfg = dataclasses.replace(cfg, progress=False)
    loss_cfg = cfg.loss_config(loss_overrides)  # the one LossConfig of the run
    if cfg.report_to != "none":
        dashboard_backend(cfg.report_to)  # a dashboard that cannot be imported is refused before anything is written
    if cfg.reward:  # imported and their signatures checked as the flag's are: before the output folder or the model
        try:
            RewardFunctions(cfg.reward)
        except RewardError as exc:
            raise Refused(f"--reward: {exc}") from None
    with contextlib.ExitStack() as held, STOP:  # (rank 0 holds the run's lock in `held`)
        STOP.collective = ctx.enabled
        ckpt, opened = open_checkpoint(cfg, loss_cfg, ctx, held)
        run = setup(cfg, loss_cfg, model_and_tokenizer, ctx, opened.claim if opened is not None else None)
        state, keep = resume(run, ckpt) if ckpt is not None else (fresh_state(run), None)
        reset_train_peak(run.device)  # train_peak_mem_mb: from here on (the models are resident, loading is over)
        record_outcomes(run, state)  # heldout.jsonl from the start (a resume: the outcomes of its checkpoint)
        resumed = (state.step, state.finished) if ckpt is not None and ctx.is_main else None  # (a model/ is older)
        if state.finished and state.step >= cfg.max_steps and not state.pending:
            print(f"nothing to do: the run finished at step {state.step} (raise --max-steps to train further)")
            resumed = None  # (its model/, written by the finish, is still the run's; the export below rewrites it)
        metrics = run.out_dir / "metrics.jsonl"
        with MetricsLog(metrics, keep, cfg.report_to, dataclasses.asdict(cfg)) if ctx.is_main else NullLog(keep) as log:
            bar = TrainBar(cfg.progress, cfg.max_steps, cfg.time_budget_s, state.step, run.loss_cfg.name)
            stopped_by = train_to_end(cfg, run, state, log, bar, resumed)
        if stopped_by is None and not cfg.save_model:  # finished, writing no model/ of its own
            drop_stale_model(run, state, resumed, f"finished at step {state.step} with --save-model false")
        export_error = None
        if cfg.save_model and state.finished and stopped_by is None and ctx.is_main:  # OUTPUT_DIR/model/ (HF folder)
            stopped_by, export_error = export_finished(run.model, run.tok, run.out_dir)
        STOP.hold()  # the summary is written whole: a signal now (a second Ctrl-C) waits for it, then is dropped
        try:
            summary = write_summary(cfg, run, state, stopped_by, t_start)
        except TrainError as exc:
            raise TrainError(f"{export_error}; {exc}" if export_error is not None else str(exc)) from None
        finally:
            STOP.release(raise_pending=False)
        if export_error is not None:
            raise TrainError(export_error)
    print(f"done in {summary['wall_s']:.0f}s; metrics in {run.out_dir / 'metrics.jsonl'}")
    return summary


def train(cfg: TrainConfig, loss_overrides: dict | None = None, model_and_tokenizer=None) -> dict:
    """Run RL training; returns a summary dict (also written to OUTPUT_DIR/summary.json). A Ctrl-C or SIGTERM
    checkpoints the run and returns (summary["interrupted"], summary["signal"]); any other exception checkpoints it
    (when the state is consistent) and propagates. The output directory is locked for the length of the call.

    Under torchrun (WORLD_SIZE > 1) every rank runs this: data-parallel over whole groups, rank 0 writes the files,
    the other ranks print nothing (docs/trainer.md, "More than one device")."""
    t_start = time.time()
    # checked again as the constructor checks it (a field set since: cfg.group_size = 1 is refused as
    # TrainConfig(group_size=1) is), before anything is written; a leading ~ of output_dir expanded
    cfg = dataclasses.replace(cfg, output_dir=expand_output_dir(cfg.output_dir))
    resolve_device(cfg.device)  # a device this machine lacks is refused before torchrun's process group
    ctx = from_env(cfg.device, cfg.dist_timeout_s)
    try:
        if ctx.enabled:
            check_world(cfg, ctx)
        quiet = open(os.devnull, "w") if not ctx.is_main else None
        with contextlib.redirect_stdout(quiet) if quiet else contextlib.nullcontext():
            try:
                with mixed_precision(cfg.mixed_precision):  # (off: a context that does nothing)
                    return _train(cfg, loss_overrides, model_and_tokenizer, ctx, t_start)
            finally:
                if quiet:
                    quiet.close()
    except BaseException as exc:
        # the traceback's frames hold the run and its DDP-wrapped model: free them before the group is destroyed
        # (distributed.shutdown says why); the traceback keeps every file and line, only the locals go (a job of one
        # keeps them, for a post-mortem debugger)
        if ctx.enabled:
            traceback.clear_frames(exc.__traceback__)
            timed_out = ctx.timeout_error(exc)  # a collective's timeout (DDP's included): name the silent rank
            if timed_out is not None and timed_out is not exc:
                raise timed_out from None
        raise
    finally:
        shutdown(ctx)
