"""What the default run prints (issue 23, item 5): no library warning in it, plain progress lines (no cursor codes)
when the output is not a terminal, the training bar's clock from the first step on (not the evaluation before it),
and the evaluation bar counting the problems evaluated."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from conftest import tiny_argv, tiny_cfg  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WARNING_LINE = re.compile(r"(\S+):(\d+): (\w+(?:Warning|Deprecation)\w*): (.*)")


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """`python -m train` on the tiny model with progress on, its output captured (not a terminal), as a user's log
    file gets it; the default warning filters."""
    out = tmp_path_factory.mktemp("default") / "run"
    argv = [a for a in tiny_argv(out, "--max-steps", "2") if a not in ("--progress", "false")]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"} | {"PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", "train", *argv], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def test_default_run_prints_no_library_warning(default_run):
    """Every warning the run prints is the project's own (raised from its files, not a deprecation): transformers'
    62 `past_key_values` FutureWarnings glued into the progress bar were the trainer passing a deprecated name."""
    found = [m.groups() for line in default_run.stderr.splitlines() for m in [WARNING_LINE.search(line)] if m]
    foreign = [
        f"{path}:{line}: {cat}: {msg}"
        for path, line, cat, msg in found
        if cat in ("FutureWarning", "DeprecationWarning", "PendingDeprecationWarning") or str(REPO) not in path
    ]
    assert not foreign, "\n".join(foreign)


def test_progress_is_plain_lines_when_not_a_terminal(default_run):
    """No carriage returns or cursor movements in a log: one line per report, each ending in a newline."""
    err = default_run.stderr
    assert "\r" not in err and "\x1b[" not in err, repr(err[:500])
    steps = [line for line in err.splitlines() if line.startswith("s_grpo: ")]
    assert [s.split()[1] for s in steps] == ["1/2", "2/2"], steps
    assert any(line.startswith("held-out eval (before): 4/4") for line in err.splitlines()), err[-2000:]


def test_training_bar_clock_starts_with_training(monkeypatch, tmp_path):
    """The training bar's clock (its elapsed time and ETA) starts at the first step, not before the held-out
    evaluation that precedes training."""
    import train.evaluate as evaluate_module
    import train.loop as loop
    from train.run import progress

    real, shown, ends = evaluate_module.evaluate, [], []

    def slow_evaluate(*args, **kwargs):  # a 3 s evaluation before (and after) training
        time.sleep(3)
        out = real(*args, **kwargs)
        ends.append(time.time())
        return out

    class Spy(progress.TrainBar):
        def step(self, record):
            shown.append((time.time() - self.t0, time.time() - ends[0]))
            super().step(record)

    monkeypatch.setattr(evaluate_module, "evaluate", slow_evaluate)
    monkeypatch.setattr(loop, "TrainBar", Spy)
    loop.train(tiny_cfg(tmp_path / "run", max_steps=1, kl_every=0, eval_k=0, progress=True))
    ((clock, since_eval),) = shown
    assert clock <= since_eval, shown  # the bar's clock started after the evaluation before training ended


def test_evaluation_bar_counts_the_problems_evaluated(monkeypatch, tmp_path):
    """n problems evaluated (greedy), pass@k on the first few of them: the bar's total is n, not n + the subset."""
    import train.evaluate as evaluate_module
    from train.run import progress

    totals = []
    real = progress.progress_bar

    def spy(show, total, desc, *args, **kwargs):
        totals.append((desc, total))
        return real(show, total, desc, *args, **kwargs)

    monkeypatch.setattr(evaluate_module, "progress_bar", spy)
    import train.loop as loop

    loop.train(tiny_cfg(tmp_path / "run", max_steps=0, kl_every=0, eval_problems=6, eval_k=2, eval_k_problems=3,
                        progress=True))  # fmt: skip
    assert totals and totals[0] == ("held-out eval (before)", 6), totals
