"""benchmarks.study_task: the decisive regime's task has the held-out set the study needs, and the entropy profile
equals a float64 computation from the full logits."""

from __future__ import annotations

import random
import statistics

import pytest
import torch

from benchmarks.study_task import entropy_profile
from study.grid import REGIMES
from train.config.cli import parse_args
from train.model import tiny_model_and_tokenizer
from train.rollout import Batch
from train.tasks.registry import TASK_OPTIONS, make_task


def test_decisive_regime_has_500_distinct_heldout_problems_per_seed():
    overrides = REGIMES["decisive"]
    cfg, _ = parse_args([a for k, v in overrides.items() if k != "use_vllm" for a in (f"--{k}", v)])
    assert cfg.eval_problems >= 500 and cfg.max_steps >= 60 and cfg.max_new_tokens >= 32
    task = make_task(cfg.task, **{k: getattr(cfg, k) for k in TASK_OPTIONS})
    for seed in range(5):
        heldout = task.heldout(cfg.eval_problems, seed)
        assert len({p.question for p in heldout}) == cfg.eval_problems
        training = {p.question for p in task.sample(400, random.Random(seed))}
        assert not training & {p.question for p in heldout}  # never drawn for training


def test_entropy_profile_matches_float64_full_logits():
    torch.manual_seed(0)
    model, tok = tiny_model_and_tokenizer(0)
    model = model.double()
    n, p, t = 4, 3, 5
    prompt_ids = torch.randint(3, 50, (n, p))
    completion_ids = torch.randint(3, 50, (n, t))
    completion_mask = torch.ones(n, t, dtype=torch.bool)
    completion_mask[1, 3:] = False  # a shorter completion
    completion_mask[2, 1:] = False
    batch = Batch(prompt_ids, torch.ones(n, p, dtype=torch.long), completion_ids, completion_mask, [""] * n,
                  torch.zeros(n), torch.zeros(n, dtype=torch.bool))  # fmt: skip
    got = entropy_profile(model, tok, batch, temperature=0.7)

    with torch.no_grad():
        logits = model(input_ids=torch.cat([prompt_ids, completion_ids], 1)).logits[:, p - 1 : -1].double() / 0.7
    logq = torch.log_softmax(logits, -1)
    ent = -(logq.exp() * logq).sum(-1)
    rows = [ent[i][completion_mask[i]] for i in range(n)]
    assert got["completions"] == n
    assert got["mean_len"] == statistics.mean(int(m.sum()) for m in completion_mask)
    assert abs(got["entropy_mean"] - statistics.mean(float(r.mean()) for r in rows)) < 1e-9
    assert abs(got["within_sd"] - statistics.mean(float(r.std()) for r in rows if r.numel() > 1)) < 1e-9
    assert abs(got["between_sd"] - statistics.stdev(float(r.mean()) for r in rows)) < 1e-9


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--seeds", "0,x"], "--seeds: '0,x': expected comma-separated integers >= 0"),
        (["--seeds", "-1"], "seeds must be >= 0"),
        (["--prompts", "0"], "--prompts: '0': expected an integer >= 1"),
        (["--before-from", "NOPE"], "not a run folder (no metrics.jsonl or config.json)"),
        (["--out", "ADIR"], "--out ADIR: is a folder; expected a file"),
    ],
)
def test_bad_arguments_are_refused_before_the_model_loads(argv, words, tmp_path, monkeypatch, capsys):
    """Each was a traceback (ValueError, FileNotFoundError after the model load, IsADirectoryError at the end)."""
    import train.model
    from benchmarks import study_task

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ADIR").mkdir()
    monkeypatch.setattr(train.model, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(SystemExit) as exc:
        study_task.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert words in err and err.startswith("usage: python -m benchmarks.study_task"), err
