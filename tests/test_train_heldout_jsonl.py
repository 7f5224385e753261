"""OUTPUT_DIR/heldout.jsonl: one line per held-out problem, in held-out order, with its greedy outcome before and
after training (and at the --eval-every evaluations). The summary's accuracies are the means of its booleans; the
outcomes of the first start survive a --resume; under torchrun the ranks' shares are put back in held-out order.

The tiny random model gets nothing right, so the tests replace the evaluation's correctness with a rule that depends
on the problem's answer and on how many evaluations came before (`Judge`): every outcome is then known in advance,
an evaluation run again (or a problem put in the wrong place) gives other booleans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from conftest import tiny_cfg  # noqa: E402
from procs import free_port  # noqa: E402

import train.evaluate as evaluate_module  # noqa: E402
import train.step as step_module  # noqa: E402
from train import loop  # noqa: E402
from train.tasks import TASK_OPTIONS, make_task  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LOSS = {"entropy_filter": None, "entropy_coef": 0.01}  # a gradient on the random model (test_train_loop's)


def rule(answer: str, k: int) -> bool:
    """Evaluation number k's verdict on a problem: about half of the problems right, another half at each k."""
    return (sum(map(ord, str(answer))) + k) % 3 == 0 or (len(str(answer)) + k) % 2 == 0


class Judge:
    """Replaces the evaluation's correctness: the k-th greedy evaluation in this process judges by `rule(answer, k)`."""

    def __init__(self):
        self.k = 0

    def __call__(self, texts, answers):
        out = [1.0 if rule(a, self.k) else 0.0 for a in answers]
        self.k += 1
        return out


def heldout(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "heldout.jsonl").read_text().splitlines()]


def evals(out: Path) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r.get("event") == "eval"]


def problems(cfg) -> list:
    return make_task(cfg.task, **{k: getattr(cfg, k) for k in TASK_OPTIONS}).heldout(cfg.eval_problems, cfg.seed)


def mean(values: list[bool]) -> float:
    return sum(values) / len(values)


def test_lines_recompute_the_summary_and_the_eval_records(tmp_path, monkeypatch):
    monkeypatch.setattr(evaluate_module, "correctness_rewards", Judge())
    cfg = tiny_cfg(tmp_path / "run", max_steps=2, eval_every=1, eval_k=0, eval_problems=9, save_model=False)
    summary = loop.train(cfg, LOSS)
    lines = heldout(tmp_path / "run")
    probs = problems(cfg)
    assert [x["id"] for x in lines] == list(range(9))
    assert [(x["q"], x["answer"]) for x in lines] == [(p.question, str(p.answer)) for p in probs]
    # evaluations 0 (before), 1 (step 1, --eval-every), 2 (after step 2)
    assert [x["before"] for x in lines] == [rule(p.answer, 0) for p in probs]
    assert [x["at"] for x in lines] == [{"1": rule(p.answer, 1)} for p in probs]
    assert [x["after"] for x in lines] == [rule(p.answer, 2) for p in probs]
    before, after = [x["before"] for x in lines], [x["after"] for x in lines]
    assert 0 < mean(before) < 1 and before != after  # the case tells the evaluations apart
    assert summary["before"]["eval_acc"] == mean(before) and summary["after"]["eval_acc"] == mean(after)
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["before"]["eval_acc"] == mean(before) and saved["after"]["eval_acc"] == mean(after)
    records = evals(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[1]["eval_acc"] == mean([x["at"]["1"] for x in lines])
    keys = {"step", "event", "eval_acc", "eval_acc_se", "eval_n", "eval_samples"}
    assert all(set(r) == keys for r in records)  # the eval records are as they were: no per-problem list


def test_max_steps_0_evaluates_once(tmp_path, monkeypatch, capsys):
    """No step, the same weights: "after" is "before"'s evaluation, not a second one (the judge is called once; it
    judges differently each time it is called, so a second evaluation would show)."""
    judge = Judge()
    monkeypatch.setattr(evaluate_module, "correctness_rewards", judge)
    cfg = tiny_cfg(tmp_path / "run", max_steps=0, eval_k=0, eval_problems=5, kl_every=0, save_model=False)
    summary = loop.train(cfg, LOSS)
    assert judge.k == 1
    lines = heldout(tmp_path / "run")
    assert len(lines) == 5 and all(x["at"] == {} for x in lines)
    assert [x["before"] for x in lines] == [rule(p.answer, 0) for p in problems(cfg)]
    assert [x["after"] for x in lines] == [x["before"] for x in lines]
    assert all(x[f"after_{k}"] == x[f"before_{k}"] for x in lines for k in ("extracted", "tokens", "hit_limit"))
    assert summary["before"]["eval_acc"] == mean([x["before"] for x in lines]) == summary["after"]["eval_acc"]
    assert summary["after"] == summary["before"] and summary["delta"] == 0
    records = evals(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 0] and records[0] == records[1]
    assert "no step was taken" in capsys.readouterr().out


def test_before_survives_a_resume(tmp_path, monkeypatch):
    """Interrupted (Ctrl-C) in step 2's rollout, then resumed in the same process: the judge's count goes on, so a
    "before" evaluated again would differ from the first start's."""
    monkeypatch.setattr(evaluate_module, "correctness_rewards", Judge())
    calls = {"n": 0}
    real = step_module.rollout

    def interrupting(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(step_module, "rollout", interrupting)
    out = tmp_path / "run"
    cfg = tiny_cfg(out, max_steps=2, eval_k=0, eval_problems=7, kl_every=0, save_model=False)
    first = loop.train(cfg, LOSS)
    assert first["interrupted"] and first["steps"] == 1
    probs = problems(cfg)
    lines = heldout(out)
    assert [x["before"] for x in lines] == [rule(p.answer, 0) for p in probs] and all(x["after"] is None for x in lines)
    monkeypatch.setattr(step_module, "rollout", real)
    resumed = loop.train(tiny_cfg(out, max_steps=2, eval_k=0, eval_problems=7, kl_every=0, save_model=False,
                                  resume=True), LOSS)  # fmt: skip
    assert resumed["steps"] == 2 and not resumed["interrupted"]
    lines = heldout(out)
    assert [x["before"] for x in lines] == [rule(p.answer, 0) for p in probs]  # from the first start
    assert [x["after"] for x in lines] == [rule(p.answer, 1) for p in probs]  # the second evaluation made
    assert resumed["before"]["eval_acc"] == mean([x["before"] for x in lines])
    assert resumed["after"]["eval_acc"] == mean([x["after"] for x in lines])


def test_overwrite_deletes_it(tmp_path):
    from train.run.rundir import RUN_FILES

    assert "heldout.jsonl" in RUN_FILES and "heldout.jsonl.tmp" in RUN_FILES


# ------------------------------------------------------------------------------------------------- torchrun

LAUNCH = """
import sys
sys.path.insert(0, {tests!r})
import train.evaluate
from test_train_heldout_jsonl import Judge
train.evaluate.correctness_rewards = Judge()
from train.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_torchrun_puts_the_ranks_shares_back_in_order(tmp_path):
    """2 gloo processes, 7 problems (rank 0 evaluates 0, 2, 4, 6; rank 1 evaluates 1, 3, 5): the file is rank 0's,
    in held-out order, and recomputes the summary. (With --log-mechanism: its fields under torchrun.)"""
    script = tmp_path / "launch.py"
    script.write_text(textwrap.dedent(LAUNCH.format(tests=str(REPO / "tests"))))
    out = tmp_path / "run"
    args = ["--model", "tiny", "--output-dir", str(out), "--prompts-per-step", "2", "--group-size", "2",
            "--max-new-tokens", "4", "--eval-problems", "7", "--eval-k", "0", "--kl-every", "0", "--max-steps", "1",
            "--progress", "false", "--threads", "1", "--save-model", "false", "--log-mechanism",
            "--loss", "entropy_filter=null,entropy_coef=0.01"]  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(script), *args]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    cfg = tiny_cfg(out, eval_problems=7)
    probs = problems(cfg)
    lines = heldout(out)
    assert [x["id"] for x in lines] == list(range(7)) and [x["q"] for x in lines] == [p.question for p in probs]
    assert [x["before"] for x in lines] == [rule(p.answer, 0) for p in probs]
    assert [x["after"] for x in lines] == [rule(p.answer, 1) for p in probs]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2
    # --log-mechanism under torchrun: the ranks' sums make the global batch's counts (4 completions, all wrong for
    # the random model), the norm of the replicated update
    (step,) = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "event" not in r]
    assert step["completions"] == 4 and step["ld_n_wrong"] + step["ld_n_correct"] == 4
    assert step["update_norm"] > 0 and step["ld_wrong"] is not None
    assert summary["before"]["eval_acc"] == mean([x["before"] for x in lines])
    assert summary["after"]["eval_acc"] == mean([x["after"] for x in lines])
