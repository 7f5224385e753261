"""study.pilot: phase 3's measurements recomputed from the run folders (docs/study-v2-preregistration.md, section 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from study import pilot

ROOT = Path(__file__).resolve().parents[1]
PHASE3 = ROOT / "benchmarks" / "results" / "study" / "v2-phase3"


def base(folder: Path, outcomes: list[tuple[bool, int, bool]], *, model="smollm2-135m", task="arithmetic",
         difficulty="4", tokens=96) -> Path:  # fmt: skip
    """A `--max-steps 0` run folder: config.json and heldout.jsonl with (right, tokens, at limit) per problem."""
    folder.mkdir(parents=True)
    train = {"model": model, "task": task, "difficulty": difficulty, "max_new_tokens": tokens, "max_steps": 0}
    (folder / "config.json").write_text(json.dumps({"train": train, "loss": {}, "world_size": 1}))
    rows = [{"id": i, "before": ok, "before_tokens": t, "before_hit_limit": hit} for i, (ok, t, hit) in
            enumerate(outcomes)]  # fmt: skip
    (folder / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_base_numbers_and_the_rule(tmp_path):
    # 3 right of 10 (0.30, inside the band), 1 at the limit (10%: allowed, the rule says "at most")
    m = pilot.base_measure(base(tmp_path / "task-l4", [(True, 20, False)] * 3 + [(False, 40, False)] * 6
                                + [(False, 96, True)]))  # fmt: skip
    assert (m["n"], m["correct"], m["at_limit"], m["median_tokens"]) == (10, 3, 1, 40)
    assert m["acc"] == pytest.approx(0.3) and m["se"] == pytest.approx((0.3 * 0.7 / 10) ** 0.5)
    assert m["verdict"] == "yes" and m["task"] == "arithmetic 4"


@pytest.mark.parametrize(
    ("acc", "limit", "want"),
    [
        (0.15, 0.0, "yes"),
        (0.60, 0.10, "yes"),
        (0.149, 0.0, "no: accuracy < 0.15"),
        (0.61, 0.0, "no: accuracy > 0.60"),
        (0.30, 0.11, "no: limit > 10%"),
        (0.035, 0.215, "no: accuracy < 0.15, limit > 10%"),
    ],
)
def test_verdict_edges(acc, limit, want):
    assert pilot.verdict(acc, limit) == want


def test_another_model_is_measured_not_screened(tmp_path):
    m = pilot.base_measure(base(tmp_path / "gemma", [(False, 48, True)] * 4, model="/x/gemma-3-270m.gguf",
                                difficulty="2,3,5", tokens=48))  # fmt: skip
    assert m["verdict"] == "- (model measurement)" and m["limit"] == 1.0


def test_a_heldout_file_without_the_v2_details_is_refused(tmp_path):
    folder = base(tmp_path / "old", [(True, 5, False)])
    (folder / "heldout.jsonl").write_text(json.dumps({"id": 0, "before": True}) + "\n")
    with pytest.raises(ValueError, match="before_tokens / before_hit_limit"):
        pilot.base_measure(folder)


def test_check_compares_pilot_md_with_the_folders(tmp_path, capsys):
    base(tmp_path / "task-l4", [(True, 20, False), (False, 30, False)])
    text = pilot.tables(tmp_path)
    (tmp_path / "pilot.md").write_text(f"# pilot\n\n{pilot.MARK}\n{text}{pilot.MARK}\n\nprose\n")
    assert pilot.main([str(tmp_path), "--check"]) == 0
    (tmp_path / "pilot.md").write_text(f"# pilot\n\n{pilot.MARK}\n{text.replace('0.500', '0.600')}{pilot.MARK}\n")
    assert pilot.main([str(tmp_path), "--check"]) == 1
    assert pilot.main([str(tmp_path / "absent")]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_the_published_pilot_regenerates():
    assert pilot.main([str(PHASE3), "--check"]) == 0


def test_a_finished_pilot_run_gets_a_row(tmp_path):
    run = tmp_path / "gemma-runs" / "runs" / "grpo_nokl_lr1.5e-4" / "seed0"
    run.mkdir(parents=True)
    train = {
        "model": "/x/gemma.gguf",
        "task": "arithmetic",
        "difficulty": "2,3,5",
        "max_new_tokens": 48,
        "max_steps": 12,
    }
    (run / "config.json").write_text(json.dumps({"train": train, "loss": {}, "world_size": 1}))
    steps = [{"step": i + 1, "step_s": 10.0 + i, "reward_mean": 0.5 if i >= 2 else 0.0} for i in range(12)]
    records = [{"step": 0, "event": "eval", "eval_acc": 0.0}, *steps, {"step": 12, "event": "eval", "eval_acc": 0.25}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"steps": 12, "before": {"eval_acc": 0.0}, "after": {"eval_acc": 0.25}}
    (run / "summary.json").write_text(json.dumps(summary))
    text = pilot.tables(tmp_path)
    row = "| grpo_nokl_lr1.5e-4 seed0 | gemma.gguf | arithmetic 2,3,5 | 12 | 0.000 -> 0.250 | 0.000 -> 0.500 | 15.5 |"
    assert row in text


def test_check_without_pilot_md_is_a_difference_not_a_traceback(tmp_path, capsys):
    base(tmp_path / "task-l4", [(True, 20, False)])
    assert pilot.main([str(tmp_path), "--check"]) == 1
    assert "differ from the run folders" in capsys.readouterr().err


def test_a_config_without_a_key_is_named(tmp_path, capsys):
    folder = base(tmp_path / "task-l4", [(True, 20, False)])
    (folder / "config.json").write_text(json.dumps({"train": {"model": "smollm2-135m"}}))
    assert pilot.main([str(tmp_path)]) == 2
    assert "lacks the key 'max_steps'" in capsys.readouterr().err
