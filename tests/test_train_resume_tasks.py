"""A run of every task resumes (a finished run extended with --resume): the answer types of jsonl, math and
humaneval (str subclasses carrying their grader) reached the checkpoint through the evaluation's samples, and
torch.load(weights_only=True) refused the whole file ("not a valid checkpoint"): no run of those tasks could resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from conftest import tiny_cfg  # noqa: E402

from train import loop  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "train" / "data"
LOSS = {"entropy_filter": None}


def _rows(tmp_path) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"question": f"{a} + {a} =", "answer": str(2 * a)}) + "\n" for a in range(12)))
    return str(path)


@pytest.mark.parametrize(
    "task",
    [
        pytest.param(dict(task="jsonl", data_path="ROWS"), id="jsonl"),
        pytest.param(dict(task="math", data_path=str(DATA / "math_sample.jsonl")), id="math"),
        pytest.param(dict(task="humaneval"), id="humaneval"),
        pytest.param(dict(task="gsm8k", data_path=str(DATA / "gsm8k_sample.jsonl")), id="gsm8k"),
    ],
)
def test_a_finished_run_of_every_task_resumes(task, tmp_path):
    if task.get("data_path") == "ROWS":
        task = {**task, "data_path": _rows(tmp_path)}
    out = tmp_path / "run"
    small = dict(max_steps=1, eval_problems=2, eval_k=0, kl_every=0, save_model=False, prompts_per_step=1,
                 group_size=2, max_new_tokens=3, **task)  # fmt: skip
    loop.train(tiny_cfg(out, **small), LOSS)
    loop.train(tiny_cfg(out, **{**small, "max_steps": 2, "resume": True}), LOSS)
    steps = [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert steps == [1, 2]
