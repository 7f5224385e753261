"""What reads the user's data, task and reward code is checked before the model loads (train/setup.py,
prepare_task), and a run refused before it wrote anything leaves no folder behind (train/run/lock.py). Before: a
malformed data file or a reward failing its pre-flight was refused after the model (and the rollout engine) had
loaded, 15 s for the 135M model, minutes for a large one, and left the empty output folder it had made."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import tiny_cfg

from train import loop
from train.errors import Refused


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: every refusal below must come first."""

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr("train.setup.load_model_and_tokenizer", load)


def test_a_malformed_data_file_is_refused_before_the_model_loads(tmp_path, no_model):
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "2 + 3", "answer": "5"}\nnot json\n')
    out = tmp_path / "a" / "b"
    with pytest.raises(Refused, match="d.jsonl.*line 2"):
        loop.train(tiny_cfg(out, task="gsm8k", data_path=str(data)))
    assert not (tmp_path / "a").exists()  # the folders it made are gone: a refused fresh run writes nothing


def test_a_reward_failing_its_pre_flight_is_refused_before_the_model_loads(tmp_path, monkeypatch, no_model):
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "early_bad_reward.py").write_text("def one(completions, **kw):\n    return [1.0]\n")
    monkeypatch.syspath_prepend(str(mods))
    out = tmp_path / "run"
    with pytest.raises(Refused, match="--reward: .*early_bad_reward:one"):
        loop.train(tiny_cfg(out, reward="early_bad_reward:one"))
    assert not out.exists()


def test_a_folder_that_was_there_stays_and_an_empty_one_the_run_made_goes(tmp_path, no_model):
    data = tmp_path / "d.jsonl"
    data.write_text("not json\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    with pytest.raises(Refused):
        loop.train(tiny_cfg(mine, task="gsm8k", data_path=str(data)))
    assert mine.is_dir() and list(mine.iterdir()) == []  # the user's (empty) folder: not ours to remove
    fresh = tmp_path / "fresh"
    with pytest.raises(AssertionError, match="the model was loaded"):  # refused later: files may be there by then
        loop.train(tiny_cfg(fresh))
    assert not fresh.exists()  # (nothing was written before the model load)


def test_a_row_without_a_field_its_reward_takes_is_refused_naming_its_line(tmp_path, monkeypatch):
    """Line 8 of 40 spelled `tagret`: the run stopped at step 95 with a message naming no line, and `--resume` after
    fixing the file was refused (the data changed since the checkpoint)."""
    from train.tasks import make_task
    from train.tasks.jsonl import DataRefused

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "early_exact.py").write_text(
        "def exact(completions, prompts, target, **kw):\n"
        "    return [float(c.strip() == t) for c, t in zip(completions, target)]\n"
        "def lenient(completions, target=None, **kw):\n    return [0.0 for _ in completions]\n"
    )
    monkeypatch.syspath_prepend(str(mods))
    rows = [f'{{"prompt": "say {i}", "target": "{i}"}}' for i in range(40)]
    rows[7] = '{"prompt": "say 7", "tagret": "7"}'
    data = tmp_path / "typo.jsonl"
    data.write_text("\n".join(rows) + "\n")
    with pytest.raises(DataRefused, match=r"typo.jsonl: line 8: no field 'target', which reward 'early_exact:exact'"):
        make_task("jsonl", data_path=str(data), reward="early_exact:exact")
    task = make_task("jsonl", data_path=str(data), reward="early_exact:lenient")  # a default: the row may lack it
    assert len(task.train) + len(task.test) == 40


def test_use_vllm_on_where_it_cannot_run_is_refused_before_the_model_loads(tmp_path, no_model):
    with pytest.raises(Refused, match="--use-vllm on: not with model 'tiny'"):
        loop.train(tiny_cfg(tmp_path / "run", use_vllm="on"))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_use_vllm_on_without_vllm_is_refused_before_the_model_loads(tmp_path, no_model):
    with pytest.raises(Refused, match=r"vllm is not installed in this environment; install it with: pip install "
                                      r"torch==2.13.0 && "):  # fmt: skip
        loop.train(tiny_cfg(tmp_path / "run", model="smollm2-135m", use_vllm="on"))


def test_a_resume_that_would_roll_out_with_another_engine_is_refused(tmp_path):
    """--use-vllm auto falls back to HF generate where vLLM does not start: a vLLM run resumed there went on with
    another sampler (no sampler log-probs, no TIS), its records different from the uninterrupted run's, silently."""
    import torch

    out = tmp_path / "run"
    loop.train(tiny_cfg(out, max_steps=1, eval_k=0, kl_every=0))
    state = out / "checkpoint" / "state.pt"
    ckpt = torch.load(state, weights_only=True)
    assert ckpt["loop"]["rollout_engine"] == "hf"
    ckpt["loop"]["rollout_engine"] = "vllm"  # as a vLLM run's checkpoint says
    torch.save(ckpt, state)
    with pytest.raises(Refused, match="--resume: the run rolled out with vLLM .* this call with HF generate"):
        loop.train(tiny_cfg(out, max_steps=2, eval_k=0, kl_every=0, resume=True))
