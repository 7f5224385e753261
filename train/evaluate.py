"""Held-out evaluation: greedy accuracy with its standard error, pass@k and maj@k (logged as eval events).

Code tasks (HumanEval) are scored by running each completion's tests in the sandbox, in parallel
(`rewards.correctness_rewards`). maj@k is not defined for them (there is no final answer to vote on): it is logged as
NaN (null in metrics.jsonl)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .config import TrainConfig
from .engines.hf import eos_ids
from .rewards import CodeTests, answers_match, correctness_rewards, extract_answer
from .rollout import Sampling, majority, rollout
from .run.files import write_text_atomic
from .run.metrics import dumps
from .run.progress import progress_bar
from .run.rng import fork_rng


@torch.no_grad()
def evaluate(
    model,
    tok,
    problems,
    cfg: TrainConfig,
    engine=None,
    system_prompt: str | None = None,
    desc: str = "held-out eval",
    k_subset=None,
) -> dict:
    """Held-out greedy accuracy (with its standard error), and pass@k / maj@k from k samples at the train temperature
    on `k_subset` (default: the first `eval_k_problems` problems). Uses its own RNG (forked), so evaluating never
    changes the training trajectory. When `cfg.progress`, a bar named `desc` counts the problems (greedy), then
    another the pass@k subset. Also returns the counts behind each rate (`eval_counts`), which a torchrun job sums over
    ranks, each problem's outcome (`eval_correct`: a list of bools, in the order of `problems`; `eval_acc` is its
    mean) and what its greedy completion was (`eval_greedy`: `greedy_details`, in the same order)."""
    k = cfg.eval_k
    subset = (problems[: cfg.eval_k_problems] if k_subset is None else k_subset) if k > 0 else []
    bar = progress_bar(cfg.progress, len(problems), desc)  # the problems evaluated; pass@k: a bar of its own

    def run(greedy: bool, n: int, probs, shapes: list | None = None) -> list[str]:
        texts = []
        for i in range(0, len(probs), max(1, cfg.eval_batch_size // n)):
            chunk = probs[i : i + max(1, cfg.eval_batch_size // n)]
            sampling = Sampling.of(cfg, system_prompt, group_size=n)
            batch = rollout(model, tok, chunk, **sampling.kwargs(), greedy=greedy, engine=engine)
            texts += batch.texts
            if shapes is not None:
                shapes += completion_shapes(batch, sampling.max_new_tokens, eos_ids(tok, model))
            if bar is not None:
                bar.update(len(chunk))
        return texts

    device = next(model.parameters()).device
    try:
        with fork_rng(device):
            torch.manual_seed(cfg.seed + 12345)
            shapes: list[tuple[int, bool]] = []
            greedy = run(True, 1, problems, shapes)
            correct = [bool(r > 0) for r in correctness_rewards(greedy, [p.answer for p in problems])]
            n_right = sum(correct)
            counts = {"right": n_right, "n": len(problems), "k_n": len(subset)}
            acc = n_right / len(problems) if problems else math.nan
            out = {
                "eval_acc": acc,
                "eval_acc_se": math.sqrt(acc * (1 - acc) / len(problems)) if problems else math.nan,
                "eval_n": len(problems),
                "eval_samples": [
                    {"q": p.question, "answer": _plain(p.answer), "greedy": t}
                    for p, t in zip(problems[:5], greedy[:5])
                ],
            }
            if k > 0:
                if bar is not None:
                    bar.close()
                    bar = progress_bar(cfg.progress, len(subset), f"{desc}, pass@{k} of the first {len(subset)}")
                sampled = run(False, k, subset) if subset else []
                groups = [sampled[i * k : (i + 1) * k] for i in range(len(subset))]
                right = correctness_rewards(sampled, [p.answer for p in subset for _ in range(k)])
                counts["pass"] = sum(any(right[i * k : (i + 1) * k]) for i in range(len(subset)))
                if not any(isinstance(p.answer, CodeTests) for p in [*problems, *subset]):  # no maj@k for code
                    counts["maj"] = sum(answers_match(majority(g), p.answer) for g, p in zip(groups, subset))
                out[f"eval_pass@{k}"] = counts["pass"] / len(subset) if subset else math.nan
                out[f"eval_maj@{k}"] = counts["maj"] / len(subset) if subset and "maj" in counts else math.nan
            out["eval_counts"] = counts
            out["eval_correct"] = correct  # per problem, in order: the greedy completion is correct
            out["eval_greedy"] = greedy_details(greedy, shapes, problems)
    finally:
        if bar is not None:
            bar.close()
    return out


def completion_shapes(batch, max_new_tokens: int, eos: set[int]) -> list[tuple[int, bool]]:
    """(length in tokens, hit the token limit) of each completion of a rollout batch: its tokens up to and including
    the first EOS (what the loss sees), and whether it ran to `max_new_tokens` without ending (truncated)."""
    ids, mask = batch.completion_ids, batch.completion_mask
    lengths = mask.sum(1).tolist()
    ended = [any(int(t) in eos for t in row[:n].tolist()) for row, n in zip(ids, lengths)]
    return [(int(n), bool(n >= max_new_tokens and not e)) for n, e in zip(lengths, ended)]


def greedy_details(texts: list[str], shapes: list[tuple[int, bool]], problems) -> list[dict]:
    """Per problem, what its greedy completion was: `extracted` (the final answer the reward read from it,
    `rewards.extract_answer`; None when it has none, and for code tasks, graded by tests), `tokens` and `hit_limit`
    (`completion_shapes`). heldout.jsonl keeps them for the evaluations before and after training, so a wrong answer
    can be told from a missing or truncated one."""
    return [
        {
            "extracted": None if isinstance(p.answer, CodeTests) else extract_answer(t),
            "tokens": n,
            "hit_limit": hit,
        }
        for t, (n, hit), p in zip(texts, shapes, problems)
    ]


def heldout_eval(cfg: TrainConfig, run, step: int, label: str | None = None) -> tuple[dict, list[dict]]:
    """`evaluate` on the held-out set at `step` -> (its eval event record, printed when `label` is given; each
    held-out problem's outcome, in held-out order: {"correct": bool, **greedy_details}). The caller writes the record
    to metrics.jsonl and the outcomes to heldout.jsonl (`heldout_lines`)."""
    name = label or f"step {step}"
    desc = f"held-out eval ({name})"
    if run.dist.enabled:
        ev = split_eval(cfg, run, desc)
    else:
        ev = evaluate(run.model, run.tok, run.heldout, cfg, run.engine, run.system_prompt, desc)
    ev.pop("eval_counts")
    correct, details = ev.pop("eval_correct"), ev.pop("eval_greedy")
    if label is not None:
        print(f"held-out {label + ':':<7} acc {ev['eval_acc']:.3f} +- {ev['eval_acc_se']:.3f} (n={ev['eval_n']})")
    return {"step": step, "event": "eval", **ev}, [{"correct": c, **d} for c, d in zip(correct, details)]


def split_eval(cfg: TrainConfig, run, desc: str) -> dict:
    """The held-out evaluation of a torchrun job: rank r takes problems r, r + W, r + 2W, ... (and of the pass@k
    subset the same way); the counts are summed over ranks into the same rates a single process reports, and the
    per-problem outcomes put back in held-out order (on every rank)."""
    r, w, k = run.dist.rank, run.dist.world, cfg.eval_k
    mine, subset = run.heldout[r::w], run.heldout[: cfg.eval_k_problems][r::w]
    ev = evaluate(run.model, run.tok, mine, cfg, run.engine, run.system_prompt, desc, k_subset=subset)
    gathered = run.dist.objects((ev["eval_counts"], ev["eval_correct"], ev["eval_greedy"]))
    totals = {key: sum(c[key] for c, _, _ in gathered) for key in ev["eval_counts"]}
    correct: list = [None] * len(run.heldout)
    details: list = [None] * len(run.heldout)
    for rank, (_, outcomes, greedy) in enumerate(gathered):
        correct[rank::w] = outcomes
        details[rank::w] = greedy
    acc = totals["right"] / totals["n"]
    out = {"eval_acc": acc, "eval_acc_se": math.sqrt(acc * (1 - acc) / totals["n"]), "eval_n": totals["n"]}
    out["eval_samples"] = ev["eval_samples"]  # rank 0's first problems
    if k > 0:
        out[f"eval_pass@{k}"] = totals["pass"] / totals["k_n"]
        out[f"eval_maj@{k}"] = totals["maj"] / totals["k_n"] if "maj" in totals else math.nan
    out["eval_counts"] = totals
    out["eval_correct"] = correct
    out["eval_greedy"] = details
    return out


def compare_heldout(summary: dict) -> None:
    """summary["delta"]: held-out accuracy after - before, also in standard errors of the difference (None when
    both standard errors are 0)."""
    b, a = summary["before"], summary["after"]
    diff_se = math.sqrt(b["eval_acc_se"] ** 2 + a["eval_acc_se"] ** 2)
    summary["delta"] = a["eval_acc"] - b["eval_acc"]
    summary["delta_in_se"] = summary["delta"] / diff_se if diff_se > 0 else None
    in_se = f" ({summary['delta_in_se']:+.1f} standard errors)" if summary["delta_in_se"] is not None else ""
    print(f"held-out change: {summary['delta']:+.3f}{in_se}")


HELDOUT_FILE = "heldout.jsonl"  # in OUTPUT_DIR


DETAIL_FIELDS = ("extracted", "tokens", "hit_limit")  # greedy_details: heldout.jsonl's PHASE_FIELD, before/after


def _correct(outcome) -> bool | None:
    """A problem's outcome as its boolean: {"correct": bool, ...} (heldout_eval), or a bool (a checkpoint written
    before the details were kept), or None (not evaluated yet)."""
    return outcome["correct"] if isinstance(outcome, dict) else outcome


def heldout_lines(problems: list, outcomes: dict | None) -> list[dict]:
    """heldout.jsonl's records: one per held-out problem, in held-out order: `id` (its index in the held-out list),
    `q` (the question), `answer`, and whether its greedy completion was correct `before` and `after` training and at
    each intermediate evaluation (`at`: {"STEP": bool}); null (`at`: {}) for an evaluation not run (yet). Then, for
    `before` and `after`, the greedy completion's `PHASE_extracted` answer, `PHASE_tokens` and `PHASE_hit_limit`
    (`greedy_details`; null where unknown: not run yet, or resumed from a checkpoint that predates them).
    `outcomes`: {"before": [outcome] | None, "after": [outcome] | None, "at": {"STEP": [outcome]}} (LoopState.heldout;
    an outcome as `heldout_eval` gives it, or a bool)."""
    outcomes = outcomes or {}
    before, after, at = outcomes.get("before"), outcomes.get("after"), outcomes.get("at") or {}

    def details(phase: str, values: list | None, i: int) -> dict:
        d = values[i] if values is not None and isinstance(values[i], dict) else {}
        return {f"{phase}_{k}": d.get(k) for k in DETAIL_FIELDS}

    return [
        {
            "id": i,
            "q": p.question,
            "answer": str(p.answer),
            "before": _correct(before[i]) if before is not None else None,
            "after": _correct(after[i]) if after is not None else None,
            "at": {step: _correct(at[step][i]) for step in sorted(at, key=int)},
            **details("before", before, i),
            **details("after", after, i),
        }
        for i, p in enumerate(problems)
    ]


def write_heldout(path: Path, problems: list, outcomes: dict | None) -> None:
    """OUTPUT_DIR/heldout.jsonl (`heldout_lines`), atomically: a temporary file renamed over it."""
    write_text_atomic(path, "".join(dumps(line) + "\n" for line in heldout_lines(problems, outcomes)))


def _plain(answer):
    """A task's answer as plain data: its text for the str subclasses that carry a grader (RowAnswer, MathAnswer,
    CodeTests), which a checkpoint read with weights_only=True could not hold; other answers as they are."""
    return str(answer) if isinstance(answer, str) else answer
