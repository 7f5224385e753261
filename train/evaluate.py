"""Held-out evaluation: greedy accuracy with its standard error, pass@k and maj@k (logged as eval events)."""

from __future__ import annotations

import math

import torch

from train.config import TrainConfig
from train.rewards import answers_match, correctness_reward
from train.rollout import majority, rollout
from train.setup import Run, fork_rng, progress_bar


@torch.no_grad()
def evaluate(
    model, tok, problems, cfg: TrainConfig, engine=None, system_prompt: str | None = None, desc: str = "held-out eval"
) -> dict:
    """Held-out greedy accuracy (with its standard error), and pass@k / maj@k from k samples at the train temperature.
    Uses its own RNG (forked), so evaluating never changes the training trajectory. A progress bar named `desc` counts
    the problems (greedy, then sampled) when `cfg.progress`."""
    k = cfg.eval_k
    subset = problems[: cfg.eval_k_problems] if k > 0 else []
    bar = progress_bar(cfg, len(problems) + len(subset), desc)

    def run(greedy: bool, n: int, probs) -> list[str]:
        texts = []
        for i in range(0, len(probs), max(1, cfg.eval_batch_size // n)):
            chunk = probs[i : i + max(1, cfg.eval_batch_size // n)]
            texts += rollout(
                model,
                tok,
                chunk,
                group_size=n,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                system_prompt=system_prompt,
                greedy=greedy,
                engine=engine,
            ).texts
            if bar is not None:
                bar.update(len(chunk))
        return texts

    device = next(model.parameters()).device
    try:
        with fork_rng(device):
            torch.manual_seed(cfg.seed + 12345)
            greedy = run(True, 1, problems)
            acc = sum(answers_match_text(t, p.answer) for t, p in zip(greedy, problems)) / len(problems)
            out = {
                "eval_acc": acc,
                "eval_acc_se": math.sqrt(acc * (1 - acc) / len(problems)),
                "eval_n": len(problems),
                "eval_samples": [
                    {"q": p.question, "answer": p.answer, "greedy": t} for p, t in zip(problems[:5], greedy[:5])
                ],
            }
            if k > 0:
                sampled = run(False, k, subset)
                groups = [sampled[i * k : (i + 1) * k] for i in range(len(subset))]
                out[f"eval_pass@{k}"] = sum(
                    any(answers_match_text(t, p.answer) for t in g) for g, p in zip(groups, subset)
                ) / len(subset)
                out[f"eval_maj@{k}"] = sum(answers_match(majority(g), p.answer) for g, p in zip(groups, subset)) / len(
                    subset
                )
    finally:
        if bar is not None:
            bar.close()
    return out


def answers_match_text(text: str, answer: str) -> bool:
    """The reward's notion of a correct completion (the extracted final answer equals `answer`)."""
    return correctness_reward(text, answer) > 0


def heldout_eval(run: Run, step: int, label: str | None = None) -> dict:
    """`evaluate` on the held-out set at `step` -> its eval event record (printed when `label` is given). The caller
    writes it to metrics.jsonl."""
    name = label or f"step {step}"
    ev = evaluate(run.model, run.tok, run.heldout, run.cfg, run.engine, run.system_prompt, f"held-out eval ({name})")
    if label is not None:
        print(f"held-out {label + ':':<7} acc {ev['eval_acc']:.3f} +- {ev['eval_acc_se']:.3f} (n={ev['eval_n']})")
    return {"step": step, "event": "eval", **ev}


def compare_heldout(summary: dict) -> None:
    """summary["delta"]: held-out accuracy after - before, also in standard errors of the difference (None when
    both standard errors are 0)."""
    b, a = summary["before"], summary["after"]
    diff_se = math.sqrt(b["eval_acc_se"] ** 2 + a["eval_acc_se"] ** 2)
    summary["delta"] = a["eval_acc"] - b["eval_acc"]
    summary["delta_in_se"] = summary["delta"] / diff_se if diff_se > 0 else None
    in_se = f" ({summary['delta_in_se']:+.1f} standard errors)" if summary["delta_in_se"] is not None else ""
    print(f"held-out change: {summary['delta']:+.3f}{in_se}")
