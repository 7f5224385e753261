"""heldout.jsonl's greedy details (the study v2's "before any run" item, docs/study-v2-preregistration.md): for the
evaluations before and after training, each problem's extracted answer, completion length in tokens and whether the
completion hit the token limit, next to the booleans that were there before (which stay as they were)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("transformers")

from conftest import tiny_cfg  # noqa: E402
from test_train_heldout_jsonl import LOSS, Judge, heldout, problems, rule  # noqa: E402

import train.evaluate as evaluate_module  # noqa: E402
from train import loop  # noqa: E402
from train.evaluate import completion_shapes, greedy_details, heldout_lines  # noqa: E402
from train.rewards import CodeTests, extract_answer  # noqa: E402


def test_completion_shapes_counts_up_to_the_first_eos_and_flags_truncation():
    eos, pad = {2}, 0
    ids = torch.tensor([[5, 6, 2, pad], [5, 6, 7, 8], [5, 6, 7, 2], [2, pad, pad, pad]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    batch = SimpleNamespace(completion_ids=ids, completion_mask=mask)
    # ended at the limit's last token with EOS: not truncated; ran 4 tokens without EOS: truncated
    assert completion_shapes(batch, 4, eos) == [(3, False), (4, True), (4, False), (1, False)]
    # a limit above the batch's width: nothing reached it
    assert completion_shapes(batch, 5, eos) == [(3, False), (4, False), (4, False), (1, False)]


def test_greedy_details_extract_the_rewards_answer():
    code = CodeTests("def f():", prompt="def f():", test="assert f() == 1", entry_point="f")
    probs = [SimpleNamespace(answer="17"), SimpleNamespace(answer="3"), SimpleNamespace(answer=code)]
    texts = ["12 + 5 = 17. The answer is 17.", "I cannot tell", "def f():\n    return 42"]
    got = greedy_details(texts, [(9, False), (4, True), (12, False)], probs)
    assert got == [
        {"extracted": "17", "tokens": 9, "hit_limit": False},
        {"extracted": None, "tokens": 4, "hit_limit": True},  # no number: no answer extracted
        {"extracted": None, "tokens": 12, "hit_limit": False},  # code is graded by its tests, never by a number
    ]


def test_lines_from_an_older_checkpoint_have_null_details():
    probs = [SimpleNamespace(question="1 + 1", answer="2"), SimpleNamespace(question="2 + 2", answer="4")]
    old = {"before": [True, False], "after": None, "at": {"3": [False, True]}}  # booleans: a checkpoint before details
    lines = heldout_lines(probs, old)
    assert [(x["before"], x["after"], x["at"]) for x in lines] == [
        (True, None, {"3": False}),
        (False, None, {"3": True}),
    ]
    keys = [f"{ph}_{k}" for ph in ("before", "after") for k in ("extracted", "tokens", "hit_limit")]
    assert all(x[k] is None for x in lines for k in keys)

    def o(correct, extracted, tokens, hit):
        return {"correct": correct, "extracted": extracted, "tokens": tokens, "hit_limit": hit}

    new = {"before": [o(True, "2", 5, False), o(False, None, 8, True)], "after": None,
           "at": {"3": [o(False, "7", 3, False), o(True, "4", 3, False)]}}  # fmt: skip
    lines = heldout_lines(probs, new)
    assert [x["before"] for x in lines] == [True, False] and [x["at"] for x in lines] == [{"3": False}, {"3": True}]
    assert [(x["before_extracted"], x["before_tokens"], x["before_hit_limit"]) for x in lines] == [
        ("2", 5, False), (None, 8, True)]  # fmt: skip
    assert all(x["after_tokens"] is None for x in lines)


def test_a_run_writes_the_details_and_they_agree_with_its_samples(tmp_path, monkeypatch):
    monkeypatch.setattr(evaluate_module, "correctness_rewards", Judge())
    out = tmp_path / "run"
    cfg = tiny_cfg(out, max_steps=1, eval_every=1, eval_k=0, eval_problems=6, save_model=False, max_new_tokens=6)
    summary = loop.train(cfg, LOSS)
    lines, probs = heldout(out), problems(cfg)
    assert [x["before"] for x in lines] == [rule(p.answer, 0) for p in probs]  # the booleans as they were
    for phase in ("before", "after"):
        for x in lines:
            assert isinstance(x[f"{phase}_tokens"], int) and 1 <= x[f"{phase}_tokens"] <= cfg.max_new_tokens
            assert isinstance(x[f"{phase}_hit_limit"], bool)
            assert not x[f"{phase}_hit_limit"] or x[f"{phase}_tokens"] == cfg.max_new_tokens
        # the first problems' greedy texts are in the summary: the extracted answers are the reward's reading of them
        samples = summary[phase]["eval_samples"]
        assert [x[f"{phase}_extracted"] for x in lines[: len(samples)]] == [
            extract_answer(s["greedy"]) for s in samples
        ]
    records = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("event") == "eval"]
    assert all(set(r) == {"step", "event", "eval_acc", "eval_acc_se", "eval_n", "eval_samples"} for r in evals)


def test_a_checkpoint_holds_bool_or_detailed_outcomes_and_nothing_else():
    from train.run.checkpoint import _heldout_ok

    good = {"correct": True, "extracted": "4", "tokens": 5, "hit_limit": False}
    assert _heldout_ok({"before": [True, False], "after": None, "at": {}})  # an older checkpoint's booleans
    assert _heldout_ok({"before": [good, {**good, "extracted": None}], "after": None, "at": {"3": [good]}})
    for bad in ({**good, "tokens": True}, {**good, "tokens": 5.0}, {**good, "correct": 1}, {**good, "extracted": 4},
                {k: v for k, v in good.items() if k != "hit_limit"}, {**good, "extra": 1}):  # fmt: skip
        assert not _heldout_ok({"before": [bad], "after": None, "at": {}}), bad
