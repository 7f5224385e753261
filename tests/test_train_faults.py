"""Trainer faults (issue 11): crafted run files, interrupts in every phase, SIGTERM, failed saves, --resume with
another configuration, two runs in one directory, strict JSON, torn metrics, exit codes, non-finite weights after the
optimizer step, progress bars, KL logged only when measured. A tiny random Llama, in-process (subprocesses where a
real signal must reach a real process)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import conftest  # noqa: E402

import train.evaluate as evaluate_module  # noqa: E402
import train.loop as loop  # noqa: E402
import train.loss as update_module  # noqa: E402
import train.step as step_module  # noqa: E402
from train.__main__ import main  # noqa: E402
from train.config import TrainConfig  # noqa: E402
from train.run.progress import bar_total  # noqa: E402

LOSS = {"entropy_filter": None, "entropy_coef": 0.01}  # a gradient on every step of a random model
REPO = Path(__file__).resolve().parents[1]

# conftest's tiny run, without periodic checkpoints (a test that wants them says save_every)
tiny_cfg = functools.partial(conftest.tiny_cfg, save_every=0)
tiny_argv = conftest.tiny_argv


def records(out) -> list[dict]:
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def strip_timing(recs: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in conftest.TIMING} for r in recs]


def saved_state(out) -> dict:
    return torch.load(Path(out) / "checkpoint" / "state.pt", weights_only=True)


class Nth:
    """Calls `real`; on its n-th call (counting only calls for which `which(*args, **kwargs)` is true) runs `fire`
    instead of or after it."""

    def __init__(self, real, n, fire, which=lambda *a, **k: True, after=False):
        self.real, self.n, self.fire, self.which, self.after, self.count = real, n, fire, which, after, 0

    def __call__(self, *args, **kwargs):
        if self.which(*args, **kwargs):
            self.count += 1
            if self.count == self.n:
                if self.after:
                    out = self.real(*args, **kwargs)
                    self.fire()
                    return out
                self.fire()
        return self.real(*args, **kwargs)


def interrupt():
    raise KeyboardInterrupt


def train_interrupted(cfg, loss=LOSS) -> dict:
    """train() with an interrupt injected: it must return (checkpointed), not let the KeyboardInterrupt out (which
    would also end the pytest session)."""
    try:
        return loop.train(cfg, loss)
    except KeyboardInterrupt:
        pytest.fail("a KeyboardInterrupt escaped train(): the interrupted run was not checkpointed")


def training_rollout(*args, **kwargs):
    return not kwargs.get("greedy") and kwargs.get("group_size") == 4


# ----------------------------------------------------------------------------------------------------- item 1


class _Payload:
    """Unpickling this calls open(path, "w"): creates a marker file. A checkpoint must never run it."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_malicious_checkpoint_is_refused_not_executed(tmp_path):
    out = tmp_path / "run"
    loop.train(tiny_cfg(out, max_steps=1, kl_every=0, eval_k=0), LOSS)
    file = out / "checkpoint" / "state.pt"
    state = torch.load(file, weights_only=False)  # the test's own file
    marker = tmp_path / "pwned"
    state["features"][0]["collapse"]["history"].append(_Payload(marker))
    torch.save(state, file)
    with pytest.raises(Exception) as exc:
        loop.train(tiny_cfg(out, max_steps=2, kl_every=0, eval_k=0, resume=True), LOSS)
    assert not marker.exists(), "the checkpoint executed code on --resume"
    assert str(file) in str(exc.value) and "not a valid checkpoint" in str(exc.value)


def test_malicious_probe_is_refused_not_executed(tmp_path):
    out = tmp_path / "run"
    loop.train(tiny_cfg(out, max_steps=1, eval_k=0), LOSS)
    marker = tmp_path / "pwned"
    torch.save({"batch": _Payload(marker), "logp0": torch.zeros(1)}, out / "probe.pt")
    with pytest.raises(Exception) as exc:
        loop.train(tiny_cfg(out, max_steps=2, eval_k=0, resume=True), LOSS)
    assert not marker.exists(), "probe.pt executed code on --resume"
    assert str(out / "probe.pt") in str(exc.value) and "not a valid" in str(exc.value)


def test_garbage_checkpoint_gives_a_clear_error(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(tiny_argv(out, "--max-steps", "1")) == 0
    (out / "checkpoint" / "state.pt").write_bytes(b"\x00 not a checkpoint")
    assert main(tiny_argv(out, "--max-steps", "2", "--resume")) == 1
    err = capsys.readouterr().err
    assert "state.pt is not a valid checkpoint" in err and "Traceback" not in err


def test_no_unsafe_deserialization_in_the_trainer():
    import re

    # the sandbox's bootstrap runs the untrusted program with exec() on purpose, in the isolated child it forks
    # (sgrpo_sandbox: limits, namespaces, its own uid); nowhere else may the trainer or the sandbox exec or eval
    allowed = {("boot.py", r"(?<![\w.])exec\(")}
    for path in [*(REPO / "train").rglob("*.py"), *(REPO / "sgrpo_sandbox").rglob("*.py")]:
        text = path.read_text()
        for bad in (r"weights_only=False", r"\bpickle\b", r"(?<![\w.])eval\(", r"(?<![\w.])exec\("):
            if (path.name, bad) not in allowed or path.parent.name != "sgrpo_sandbox":
                assert not re.search(bad, text), (path.name, bad)
    assert len(re.findall(r"(?<![\w.])exec\(", (REPO / "sgrpo_sandbox" / "boot.py").read_text())) == 1


# ----------------------------------------------------------------------------------------------------- item 5 (+6)

# Where the interrupt hits, as (what to patch, call number, fire after the real call?). The run: 4 steps, KL probe
# at steps 2 and 4, held-out eval before, at step 2 and after, checkpoints at steps 2 and 4 and the final one.
PHASE_CFG = dict(max_steps=4, kl_every=2, eval_every=2, save_every=2)


def _fail_nth_state_save(n, exc):
    """torch.save that writes half a file and raises `exc()` on the n-th save of a checkpoint."""
    real, count = torch.save, [0]

    def save(obj, f, *args, **kwargs):
        if str(getattr(f, "name", f)).endswith("state.pt.tmp"):
            count[0] += 1
            if count[0] == n:
                if isinstance(f, str | os.PathLike):
                    Path(f).write_bytes(b"PK\x03\x04 half a checkpoint")
                else:
                    f.write(b"PK\x03\x04 half a checkpoint")
                raise exc()
        return real(obj, f, *args, **kwargs)

    return save


PHASES = {  # phase: (what to patch, call number, what the checkpoint left by the interrupt holds: step, pending)
    "before_eval": ("evaluate", 1, (0, ["before"])),
    "rollout": ("rollout", 2, (1, [])),
    "loss": ("sgrpo_loss", 2, (1, [])),
    "inside_optimizer_step": ("adamw_step", 2, (1, [])),  # an exception after the weights moved: step undone
    "signal_during_step": ("adamw_step_signal", 2, (2, ["kl", "log", "eval", "save"])),  # a real SIGINT: waits
    "kl_probe": ("kl_from_init", 1, (2, ["kl", "log", "eval", "save"])),
    "periodic_eval": ("evaluate", 2, (2, ["eval", "save"])),
    "periodic_save": ("save", 1, (2, [])),
    "final_eval": ("evaluate", 3, (4, ["after", "save"])),
    "final_save": ("save", 3, (4, [])),
    "error_in_periodic_eval": ("evaluate_error", 2, (2, ["eval", "save"])),  # not an interrupt: an error (item 6)
}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    summary = loop.train(tiny_cfg(out, **PHASE_CFG), LOSS)
    return out, summary


def _patch(monkeypatch, what, n):
    if what == "evaluate":
        monkeypatch.setattr(evaluate_module, "evaluate", Nth(evaluate_module.evaluate, n, interrupt))
    elif what == "evaluate_error":

        def boom():
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(evaluate_module, "evaluate", Nth(evaluate_module.evaluate, n, boom))
    elif what == "rollout":
        monkeypatch.setattr(step_module, "rollout", Nth(step_module.rollout, n, interrupt, training_rollout))
    elif what == "sgrpo_loss":
        monkeypatch.setattr(update_module, "sgrpo_loss", Nth(update_module.sgrpo_loss, n, interrupt))
    elif what == "kl_from_init":
        monkeypatch.setattr(loop, "kl_from_init", Nth(loop.kl_from_init, n, interrupt))
    elif what.startswith("adamw_step"):
        fire = (lambda: os.kill(os.getpid(), signal.SIGINT)) if what.endswith("signal") else interrupt
        real, count = torch.optim.AdamW.step, [0]

        def step(self, *args, **kwargs):  # the real step, then the interrupt: the weights have moved
            out = real(self, *args, **kwargs)
            count[0] += 1
            if count[0] == n:
                fire()
            return out

        monkeypatch.setattr(torch.optim.AdamW, "step", step)
    elif what == "save":
        monkeypatch.setattr(torch, "save", _fail_nth_state_save(n, KeyboardInterrupt))
    else:
        raise AssertionError(what)


@pytest.mark.parametrize("phase", sorted(PHASES))
def test_interrupt_in_any_phase_resumes_exactly(tmp_path, monkeypatch, phase, uninterrupted):
    """Interrupted (Ctrl-C, or an error) in `phase`, then resumed: the same metrics (timing fields aside), the same
    final weights and optimizer state, bitwise, as the uninterrupted run."""
    ref_out, ref_summary = uninterrupted
    out = tmp_path / "run"
    what, n, (left_step, left_pending) = PHASES[phase]
    with monkeypatch.context() as m:
        _patch(m, what, n)
        if what == "evaluate_error":
            with pytest.raises(RuntimeError, match="disk on fire"):
                loop.train(tiny_cfg(out, **PHASE_CFG), LOSS)
        else:
            first = train_interrupted(tiny_cfg(out, **PHASE_CFG))
            assert first["interrupted"]
    assert not (out / "checkpoint" / "state.pt.tmp").exists()
    left = saved_state(out)
    resumed = loop.train(tiny_cfg(out, resume=True, **PHASE_CFG), LOSS)
    assert not resumed["interrupted"] and resumed["steps"] == 4
    assert strip_timing(records(out)) == strip_timing(records(ref_out))
    assert resumed["before"] == ref_summary["before"] and resumed["after"] == ref_summary["after"]
    a, b = saved_state(ref_out), saved_state(out)
    assert a["trainable"].keys() == b["trainable"].keys()
    for name in a["trainable"]:
        assert torch.equal(a["trainable"][name], b["trainable"][name]), name
    for key, sa in a["optimizer"]["state"].items():
        for k, v in sa.items():
            assert torch.equal(v, b["optimizer"]["state"][key][k]), (key, k)
    assert (left["step"], left["loop"]["pending"]) == (left_step, left_pending)
    assert what == "evaluate_error" or first["signal"] == "SIGINT"


# ----------------------------------------------------------------------------------------------------- item 6

DRIVER = """
import os, signal, sys
import train.step as step
from train.__main__ import main

real, n = step.rollout, [0]

def rollout(*args, **kwargs):
    if not kwargs.get("greedy") and kwargs.get("group_size") == 2:
        n[0] += 1
        if n[0] == 2:
            os.kill(os.getpid(), signal.{sig})
    return real(*args, **kwargs)

step.rollout = rollout
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_signal_checkpoints_and_exits_with_its_code(tmp_path, sig, code):
    """A real SIGTERM / SIGINT at step 2 (of a process with the default save_every): a checkpoint at step 1, exit
    status 128 + the signal number, and --resume finishes the run."""
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    script = textwrap.dedent(DRIVER).replace("{sig}", sig)
    args = tiny_argv(out, "--max-steps", "3")
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert saved_state(out)["step"] == 1
    assert main([*args, "--resume"]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 3
    assert records(out)[-1]["step"] == 3


def test_checkpoints_are_periodic_by_default():
    assert TrainConfig().save_every > 0


def test_failed_final_save_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    args = tiny_argv(out, "--max-steps", "2", "--save-every", "1")
    with monkeypatch.context() as m:
        m.setattr(
            torch, "save", _fail_nth_state_save(3, lambda: OSError(28, "No space left on device"))
        )  # step 1, step 2: fine; the one after the final eval: disk full
        assert main(args) == 1
    err = capsys.readouterr().err
    assert "could not write" in err and "No space left on device" in err and "unchanged" in err
    assert not (out / "checkpoint" / "state.pt.tmp").exists()
    assert saved_state(out)["step"] == 2  # the last good checkpoint
    assert main([*args, "--resume"]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    evals = [r for r in records(out) if r.get("event") == "eval"]
    assert [r["step"] for r in evals] == [0, 2]


# ----------------------------------------------------------------------------------------------------- item 7


@pytest.mark.parametrize(
    "change, named",
    [
        ({"preset": "dapo"}, ["--preset: checkpoint 's_grpo', now 'dapo'", "loss.name"]),
        ({"lr": 0.5}, ["--lr: checkpoint 0.001, now 0.5"]),
        ({"group_size": 2}, ["--group-size: checkpoint 4, now 2"]),
        ({"seed": 1}, ["--seed: checkpoint 0, now 1"]),
        ({"loss": "entropy_coef=0.5"}, ["loss.entropy_coef: checkpoint 0.01, now 0.5"]),
    ],
)
def test_resume_refuses_a_different_configuration(tmp_path, change, named):
    out = tmp_path / "run"
    loop.train(tiny_cfg(out, max_steps=1, kl_every=0, eval_k=0), LOSS)
    config_before = (out / "config.json").read_text()
    overrides = dict(LOSS)
    if "loss" in change:
        overrides.pop("entropy_coef")
    with pytest.raises(Exception) as exc:
        loop.train(tiny_cfg(out, max_steps=2, kl_every=0, eval_k=0, resume=True, **change), overrides)
    for text in named:
        assert text in str(exc.value)
    assert (out / "config.json").read_text() == config_before
    assert saved_state(out)["step"] == 1


def test_resume_accepts_the_safe_changes(tmp_path):
    out = tmp_path / "run"
    loop.train(tiny_cfg(out, max_steps=1, kl_every=0, eval_k=0), LOSS)
    safe = dict(max_steps=3, progress=False, eval_every=1, save_every=1, time_budget_s=600.0, kl_every=1)
    summary = loop.train(tiny_cfg(out, eval_k=0, resume=True, **safe), LOSS)
    assert summary["steps"] == 3


# ----------------------------------------------------------------------------------------------------- item 8


def test_second_run_in_a_busy_directory_is_refused(tmp_path, monkeypatch):
    """Run A is in its first held-out eval; run B in the same directory is refused (naming A's pid) and A's metrics
    are its own."""
    out = tmp_path / "run"
    entered, go, result = threading.Event(), threading.Event(), {}
    real = evaluate_module.evaluate

    def slow_evaluate(*args, **kwargs):
        if threading.current_thread().name == "run-a":
            entered.set()
            go.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate_module, "evaluate", slow_evaluate)
    thread = threading.Thread(
        target=lambda: result.setdefault("a", loop.train(tiny_cfg(out, max_steps=2, eval_k=0), LOSS)), name="run-a"
    )
    thread.start()
    try:
        assert entered.wait(60)
        with pytest.raises(Exception) as exc:
            loop.train(tiny_cfg(out, max_steps=1, eval_k=0, overwrite=True), LOSS)
        assert "in use by another run" in str(exc.value) and f"pid {os.getpid()}" in str(exc.value)
    finally:
        go.set()
        thread.join(60)
    assert result["a"]["steps"] == 2
    assert [r["step"] for r in records(out) if r.get("event") != "eval"] == [1, 2]
    assert not (out / "train.lock").exists()  # released at the end


def test_rerun_without_resume_refuses_to_overwrite(tmp_path):
    out = tmp_path / "run"
    loop.train(tiny_cfg(out, max_steps=2, kl_every=0, eval_k=0), LOSS)
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(Exception) as exc:
        loop.train(tiny_cfg(out, max_steps=1, kl_every=0, eval_k=0), LOSS)
    assert "already holds a finished run" in str(exc.value) and "--overwrite" in str(exc.value)
    assert (out / "metrics.jsonl").read_text() == before and saved_state(out)["step"] == 2
    loop.train(tiny_cfg(out, max_steps=1, kl_every=0, eval_k=0, overwrite=True), LOSS)
    assert [r["step"] for r in records(out) if r.get("event") != "eval"] == [1]
    with pytest.raises(Exception, match="--resume .* --overwrite"):
        loop.train(tiny_cfg(out, max_steps=1, resume=True, overwrite=True), LOSS)


@pytest.mark.parametrize("flock", [True, False])
def test_stale_lock_of_a_dead_process_does_not_block(tmp_path, monkeypatch, flock):
    if not flock:
        from train.run import lock

        monkeypatch.setattr(lock, "fcntl", None)  # the pid-file fallback
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    out = tmp_path / "run"
    out.mkdir()
    info = {"pid": int(dead.stdout), "host": __import__("socket").gethostname(), "started": "earlier"}
    (out / "train.lock").write_text(json.dumps(info))
    assert loop.train(tiny_cfg(out, max_steps=1, kl_every=0, eval_k=0), LOSS)["steps"] == 1
    assert not (out / "train.lock").exists()
    if not flock:  # a live pid on this host blocks
        (out / "train.lock").write_text(json.dumps({**info, "pid": os.getpid()}))
        with pytest.raises(lock.RunLocked, match="in use by another run"):
            loop.train(tiny_cfg(out, max_steps=2, kl_every=0, eval_k=0, resume=True), LOSS)


# ----------------------------------------------------------------------------------------------------- item 9


def _strict(text: str):
    def refuse(name):
        raise ValueError(f"bare {name} in JSON")

    return json.loads(text, parse_constant=refuse)


def test_metrics_and_summary_are_strict_json(tmp_path, monkeypatch):
    real = update_module.sgrpo_loss

    def nan_loss(*args, **kwargs):  # every update skipped: no gradient, grad_norm NaN
        loss, metrics = real(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(update_module, "sgrpo_loss", nan_loss)
    out = tmp_path / "run"
    loop.train(tiny_cfg(out, max_steps=2, kl_every=0, eval_k=0), LOSS)
    recs = [_strict(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if r.get("event") != "eval"]
    assert steps[0]["grad_norm"] is None and steps[0]["skipped"] == 1
    summary = _strict((out / "summary.json").read_text())
    assert summary["delta_in_se"] is None  # 0 / 0 standard errors
    _strict((out / "config.json").read_text())


def test_resuming_a_finished_run_writes_nothing_twice(tmp_path, capsys):
    out = tmp_path / "run"
    loop.train(tiny_cfg(out, max_steps=2, eval_k=0), LOSS)
    before = (out / "metrics.jsonl").read_text()
    again = loop.train(tiny_cfg(out, max_steps=2, eval_k=0, resume=True), LOSS)
    assert (out / "metrics.jsonl").read_text() == before
    assert "nothing to do" in capsys.readouterr().out and again["after"] is not None
    longer = loop.train(tiny_cfg(out, max_steps=3, eval_k=0, resume=True), LOSS)  # extending it
    assert longer["steps"] == 3
    assert [(r["step"], r.get("event")) for r in records(out)] == [
        (0, "eval"),
        (1, None),
        (2, None),
        (2, "eval"),
        (3, None),
        (3, "eval"),
    ]


def test_torn_last_line_does_not_block_resume(tmp_path, monkeypatch):
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(step_module, "rollout", Nth(step_module.rollout, 2, interrupt, training_rollout))
        train_interrupted(tiny_cfg(out, max_steps=3, eval_k=0))
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "reward_me')  # a write cut short
    assert loop.train(tiny_cfg(out, max_steps=3, eval_k=0, resume=True), LOSS)["steps"] == 3
    assert [r["step"] for r in map(_strict, (out / "metrics.jsonl").read_text().splitlines())] == [0, 1, 2, 3, 3]


def test_interrupted_cli_exits_130(tmp_path, monkeypatch):
    monkeypatch.setattr(
        step_module, "rollout", Nth(step_module.rollout, 2, interrupt, lambda *a, **k: not k.get("greedy"))
    )
    try:
        assert main(tiny_argv(tmp_path / "run", "--max-steps", "3")) == 130
    except KeyboardInterrupt:
        pytest.fail("a KeyboardInterrupt escaped main()")


# ----------------------------------------------------------------------------------------------------- item 12


def _nan_after_step(n):
    real, count = torch.optim.AdamW.step, [0]

    def step(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        count[0] += 1
        if count[0] == n:
            with torch.no_grad():
                self.param_groups[0]["params"][0].view(-1)[0] = float("nan")
        return out

    return step


def test_non_finite_weights_after_the_step_are_undone(tmp_path, monkeypatch, capsys):
    one = tmp_path / "one"
    loop.train(tiny_cfg(one, max_steps=1, kl_every=0, eval_k=0, save_every=1), LOSS)
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(torch.optim.AdamW, "step", _nan_after_step(2))
        loop.train(tiny_cfg(out, max_steps=2, kl_every=0, eval_k=0, save_every=1), LOSS)
    log = capsys.readouterr().out
    assert "step 2: update skipped" in log and "non-finite" in log and "undone" in log
    assert [r["skipped"] for r in records(out) if r.get("event") != "eval"] == [0, 1]
    a, b = saved_state(one), saved_state(out)
    for name, value in b["trainable"].items():
        assert torch.isfinite(value).all()
        assert torch.equal(value, a["trainable"][name]), name  # step 2 undone: the weights after step 1
    for key, sa in a["optimizer"]["state"].items():
        for k, v in sa.items():
            assert torch.equal(v, b["optimizer"]["state"][key][k]), (key, k)  # and the Adam state after step 1


def test_non_finite_weights_without_the_guard_stop_the_run_unsaved(tmp_path, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setattr(torch.optim.AdamW, "step", _nan_after_step(2))
    with pytest.raises(Exception, match="non-finite"):
        loop.train(tiny_cfg(out, max_steps=3, kl_every=0, eval_k=0, save_every=1, step_guard=False), LOSS)
    state = saved_state(out)
    assert state["step"] == 1 and all(torch.isfinite(v).all() for v in state["trainable"].values())


# ----------------------------------------------------------------------------------------------------- items 14, 15


def test_long_phases_show_named_progress_bars(tmp_path, capsys):
    loop.train(tiny_cfg(tmp_path / "run", max_steps=1, progress=True), LOSS)
    err = capsys.readouterr().err
    for name in ("KL probe", "held-out eval (before)", "held-out eval (after)"):
        assert name in err, name
    quiet = loop.train(tiny_cfg(tmp_path / "quiet", max_steps=1, progress=False), LOSS)
    assert quiet["steps"] == 1 and "held-out eval" not in capsys.readouterr().err


def test_training_bar_total_follows_the_time_budget():
    cfg = TrainConfig(max_steps=100, time_budget_s=100.0)
    budget = (cfg.max_steps, cfg.time_budget_s)
    assert bar_total(*budget, 0, 0, 0.0) == 100  # no pace yet
    assert bar_total(*budget, 0, 10, 50.0) == 10 + 10 + 1  # 5 s a step, 50 s left; one more starts at t = 100
    assert bar_total(*budget, 0, 10, 120.0) == 10  # spent: the next check stops
    assert bar_total(*budget, 5, 10, 5.0) == 100  # fast: max_steps comes first
    no_budget = TrainConfig(max_steps=7)
    assert bar_total(no_budget.max_steps, no_budget.time_budget_s, 0, 3, 1e6) == 7  # no budget


def test_kl_from_init_is_null_where_not_measured(tmp_path):
    out = tmp_path / "run"
    loop.train(tiny_cfg(out, max_steps=3, kl_every=2, eval_k=0), LOSS)
    kl = [r["kl_from_init"] for r in records(out) if r.get("event") != "eval"]
    assert kl[0] is None and kl[1] > 0 and kl[2] > 0  # measured at step 2 (kl_every) and 3 (the last)


# ----------------------------------------------------------------------------------------------------- issue 23, item 4


@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory):
    """A finished 1-step run (with its checkpoint), copied by each test that changes it."""
    out = tmp_path_factory.mktemp("one_step") / "run"
    loop.train(tiny_cfg(out, max_steps=1, kl_every=0, eval_k=0), LOSS)
    return out


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_resume_refuses_a_checkpoint_that_is_not_a_regular_file(tmp_path):
    """state.pt a FIFO: opening it for reading would wait for a writer forever. It is refused at once, named."""
    from train.run.checkpoint import CheckpointError, read_checkpoint

    file = tmp_path / "run" / "checkpoint" / "state.pt"
    file.parent.mkdir(parents=True)
    os.mkfifo(file)
    outcome: list = []

    def read():
        try:
            read_checkpoint(file)
            outcome.append("read")
        except Exception as exc:  # noqa: BLE001 -- the test inspects it
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # let the blocked reader go (it sees end of file) before failing
        os.close(os.open(file, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
        pytest.fail("read_checkpoint of a FIFO blocked for 10 s")
    assert isinstance(outcome[0], CheckpointError), outcome
    assert str(file) in str(outcome[0]) and "not a regular file" in str(outcome[0])


def test_cli_resume_from_a_fifo_is_an_error_not_a_hang(tmp_path, capsys):
    file = tmp_path / "run" / "checkpoint" / "state.pt"
    file.parent.mkdir(parents=True)
    os.mkfifo(file)
    timer = threading.Timer(30, lambda: os.close(os.open(file, os.O_WRONLY | os.O_NONBLOCK)))  # unblock a hang
    timer.start()
    try:
        code = main(tiny_argv(tmp_path / "run", "--max-steps", "1", "--resume"))
    finally:
        timer.cancel()
    err = capsys.readouterr().err
    assert code == 1 and "not a regular file" in err and str(file) in err, err


def _tampered(run: Path, dst: Path, change) -> Path:
    out = _copy_run(run, dst)
    file = out / "checkpoint" / "state.pt"
    state = torch.load(file, weights_only=True)
    change(state)
    torch.save(state, file)
    return file


def _set_step(state):
    state["step"] = 10**12


def _nan_exp_avg(state):
    first = next(iter(state["optimizer"]["state"].values()))
    first["exp_avg"].view(-1)[0] = float("nan")


def _inf_adam_step(state):
    first = next(iter(state["optimizer"]["state"].values()))
    first["step"].fill_(float("inf"))


def _scheduler_far_ahead(state):
    state["scheduler"]["last_epoch"] = 10**12


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (_set_step, "'step' 1000000000000"),
        (_nan_exp_avg, "exp_avg"),
        (_inf_adam_step, "'step'"),
        (_scheduler_far_ahead, "last_epoch"),
    ],
)
def test_resume_refuses_absurd_or_non_finite_checkpoint_fields(tmp_path, one_step_run, change, named):
    """A step of 10^12 (the run would report 'nothing to do'), a NaN in Adam's moments (every later step skipped
    silently), a non-finite Adam step count, a schedule far ahead of the step: refused on --resume, the file and the
    field named, nothing trained."""
    from train.run.checkpoint import CheckpointError

    out = tmp_path / "run"
    file = _tampered(one_step_run, out, change)
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(CheckpointError) as info:
        loop.train(tiny_cfg(out, max_steps=2, kl_every=0, eval_k=0, resume=True), LOSS)
    assert f"{file} is not a valid checkpoint" in str(info.value) and named in str(info.value), str(info.value)
    assert (out / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_step_guard_names_exactly_the_non_finite_tensors(dtype):
    """The guard screens with one sum a tensor (NaN or infinite whenever an element is) and checks exactly only
    when the screen fails: every kind of non-finite element is named, and huge finite weights (whose sum would
    overflow in their own dtype) are not."""
    from train.features.step_guard import StepGuard

    big = torch.finfo(dtype).max
    values = {
        "ok": [0.5, -1.0, 2.0],
        "nan": [0.0, float("nan"), 1.0],
        "pos_inf": [float("inf"), 1.0, 1.0],
        "neg_inf": [1.0, float("-inf"), 1.0],
        "both_inf": [float("inf"), float("-inf"), 1.0],  # its sum is NaN
        "huge": [big, big, big],  # finite, its sum overflows in the tensor's dtype
        "huge_neg": [-big, -big, 3.0],
    }
    named = [(n, torch.nn.Parameter(torch.tensor(v, dtype=dtype))) for n, v in values.items()]
    opt = torch.optim.SGD([p for _, p in named], lr=0.1)
    assert StepGuard(named, opt).non_finite() == ["nan", "pos_inf", "neg_inf", "both_inf"]
    finite = [(n, p) for n, p in named if n in ("ok", "huge", "huge_neg")]
    assert StepGuard(finite, opt).non_finite() == []
    for bad in ("nan", "pos_inf", "neg_inf", "both_inf"):  # each alone among finite ones: the screen must see it
        assert StepGuard([*finite, *[(n, p) for n, p in named if n == bad]], opt).non_finite() == [bad]
