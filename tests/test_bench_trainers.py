"""benchmarks.bench_trainers: the summary arithmetic against hand-computed values, the refusals, and the three
trainers (bundled, TRL's GRPOTrainer, SGRPOTrainer) end to end on a tiny Llama saved to disk (2 steps each)."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_trainers as bt


def test_summarize_skips_the_first_step():
    s = bt.summarize([10.0, 2.0, 4.0], [100.0, 30.0, 90.0])
    assert s["step_s_mean"] == pytest.approx(3.0)
    assert s["tokens_per_s"] == pytest.approx(120.0 / 6.0)
    assert s["tokens_per_step"] == pytest.approx(60.0)
    one = bt.summarize([5.0], [50.0])  # a single step is all there is
    assert one["step_s_mean"] == 5.0 and one["tokens_per_s"] == 10.0
    with pytest.raises(ValueError, match="must pair up"):
        bt.summarize([1.0, 2.0], [3.0])


def test_table_ratios_are_against_grpotrainer():
    rows = [dict(trainer=k, loss_type="x", steps=3, step_s_mean=1.0, tokens_per_s=tps, train_peak_mem_mb=1.0,
                 peak_mem_mb=2.0, heldout_before=0.1, heldout_after=0.2) for k, tps in
            (("bundled", 30.0), ("trl", 10.0), ("sgrpo", 15.0))]  # fmt: skip
    lines = bt.table(rows).splitlines()
    assert "| 3.00x |" in lines[2] and "| 1.00x |" in lines[3] and "| 1.50x |" in lines[4]


def test_bad_trainer_names_are_refused(capsys):
    with pytest.raises(SystemExit):
        bt.main(["--trainers", "bundled,verl"])
    assert "expected names from bundled, trl, sgrpo" in capsys.readouterr().err


def test_a_trainer_named_twice_is_refused(capsys):
    """Before: both runs ran and the second's row replaced the first's in the table."""
    with pytest.raises(SystemExit) as exc:
        bt.main(["--trainers", "bundled,trl,bundled"])
    assert exc.value.code == 2 and "bundled named twice" in capsys.readouterr().err


@pytest.mark.slow
def test_three_trainers_end_to_end_on_a_tiny_model(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    from tests.test_integrations_trl import model, tokenizer

    tok = tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    m = model(tied=True)
    m.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    monkeypatch.setattr(bt, "SCRATCH", tmp_path / "work")
    out = tmp_path / "out"
    rc = bt.main(["--model", str(tmp_path / "tiny"), "--steps", "2", "--prompts", "2", "--group-size", "4",
                  "--max-new-tokens", "4", "--eval-problems", "4", "--threads", "1", "--out", str(out)])  # fmt: skip
    assert rc == 0
    res = json.loads((out / "trainers.json").read_text())
    rows = {r["trainer"]: r for r in res["trainers"]}
    assert set(rows) == {"bundled", "trl", "sgrpo"}
    for r in rows.values():
        assert r["steps"] == 2 and len(r["step_s"]) == 2 and r["step_s_mean"] > 0
        assert 0 < r["tokens_per_step"] <= 2 * 4 * 4  # completions x max new tokens
        assert r["train_peak_mem_mb"] > 0 and 0 <= r["heldout_before"] <= 1
    assert rows["sgrpo"]["loss_type"] == "s_grpo preset"
    assert "| TRL `GRPOTrainer` |" in (out / "trainers.md").read_text()
