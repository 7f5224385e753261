"""A split whose side holds a problem but is seldom drawn (a tiny --heldout-frac, or one near 1) is refused when the
task is built, in one line, instead of `_draw` giving up with a RuntimeError traceback at the start or mid-run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from train.tasks.arithmetic import ArithmeticTask
from train.tasks.base import TaskRefused
from train.tasks.wordproblems import WordProblemTask

ROOT = Path(__file__).resolve().parent.parent


def test_a_held_out_side_seldom_drawn_is_refused():
    # --difficulty 1,2,5 at 0.001: check_split finds a held-out problem, but 1 draw in 10,000 lands there
    expected = (r"--heldout-frac 0.001 with --difficulty 1,2,5: only 1 of 10,000 problems drawn from the task land on "
                r"the held-out side \(0.0001\).*use a larger --heldout-frac")  # fmt: skip
    with pytest.raises(TaskRefused, match=expected):
        ArithmeticTask("1,2,5", heldout_frac=0.001)


def test_a_training_side_seldom_drawn_is_refused():
    with pytest.raises(TaskRefused, match=r"--heldout-frac 0.999: only \d+ of 10,000 .* on the training side.*smaller"):
        WordProblemTask(heldout_frac=0.999)


@pytest.mark.parametrize("frac", [0.05, 0.2, 0.5, 0.95])
def test_usual_splits_pass_and_draw_from_both_sides(frac):
    import random

    for task in (ArithmeticTask("1-3", heldout_frac=frac), WordProblemTask(heldout_frac=frac)):
        assert len(task.sample(8, random.Random(0))) == 8
        assert task.heldout(4, seed=0)


def test_the_trainer_refuses_it_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "train", "--model", "tiny", "--heldout-frac", "0.001", "--max-steps", "1",
         "--output-dir", str(tmp_path / "run")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("error: ")] == [
        "error: --heldout-frac 0.001 with --difficulty 1,2,5: only 1 of 10,000 problems drawn from the task land on "
        "the held-out side (0.0001); drawing a side that comes up less than 0.002 of the time can stall: use a larger "
        "--heldout-frac"
    ]
