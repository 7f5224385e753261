"""benchmarks.ab_decisive_compare: its arguments are parsed (it had none: IndexError, ValueError, StatisticsError on
user error) and it reports what it compares."""

from __future__ import annotations

import json

import pytest

from benchmarks import ab_decisive_compare as ab


def _run(folder, step_s: list[float], loss: float = 0.5):
    folder.mkdir(parents=True)
    recs = [{"step": 0, "event": "eval", "eval_acc": 0.1}]
    recs += [{"step": i + 1, "loss": loss, "step_s": t, "gen_s": 0.1, "sync_s": 0.0} for i, t in enumerate(step_s)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([], "the following arguments are required: out, arm, rounds"),
        (["{tmp}", "grpo_nokl", "x"], "argument rounds: 'x': expected an integer >= 1"),
        (["{tmp}", "grpo_nokl", "0"], "argument rounds: '0': expected an integer >= 1"),
        (["{tmp}", "grpo_nokl", "1"], "no metrics.jsonl in grpo_nokl-old-r1, grpo_nokl-new-r1"),
    ],
)
def test_bad_arguments_exit_2_naming_them(argv, words, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        ab.main([a.format(tmp=tmp_path) for a in argv])
    assert exc.value.code == 2 and words in capsys.readouterr().err


def test_it_pairs_the_steps_and_flags_a_differing_record(tmp_path, capsys):
    _run(tmp_path / "a-old-r1", [2.0, 2.0, 3.0])
    _run(tmp_path / "a-new-r1", [1.0, 1.0, 1.5])
    assert ab.main([str(tmp_path), "a", "1"]) == 0
    out = capsys.readouterr().out
    assert "records: all equal" in out and "2 paired steps: step_s old/new median 2.000" in out
    _run(tmp_path / "b-old-r1", [2.0], loss=0.5)
    _run(tmp_path / "b-new-r1", [1.0], loss=0.6)
    assert ab.main([str(tmp_path), "b", "1"]) == 1  # a differing record, and no step after the first to pair
    captured = capsys.readouterr()
    assert "DIFF round 1 step 1" in captured.out and "no step after the first" in captured.err
