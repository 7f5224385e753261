"""The three properties a study task needs (issue: "a task with room"), measured on the base policy:

1. distinct held-out problems per seed (never drawn for training: the hash split of train/tasks/base.py);
2. base greedy accuracy on them (a run's first held-out evaluation, before training, e.g. a study run of the regime);
3. completions long enough that per-token entropy varies inside a completion: sampled completions (the regime's
   temperature and length limit) scored with the project's fused op; their length, how many hit the limit, and the
   spread of token entropy inside a completion against the spread between completions.

    python -m benchmarks.study_task --regime decisive --before-from RUN_DIR [--prompts 8] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.common import check_out, int_at_least


def entropy_profile(model, tok, batch, temperature: float) -> dict:
    """Per-token entropy of the sampled completions under `model` (fused op on the final hidden states)."""
    from sgrpo_kernels import linear_logprobs
    from train.model import head_weight

    ids = torch.cat([batch.prompt_ids, batch.completion_ids], 1)
    mask = torch.cat([batch.prompt_mask.bool(), batch.completion_mask], 1)
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True).hidden_states[-1]
    p = batch.prompt_ids.shape[1]
    h = hidden[:, p - 1 : -1]
    out = linear_logprobs(h, head_weight(model), batch.completion_ids, temperature=temperature)
    within, means, lengths = [], [], []
    for row in range(ids.shape[0]):
        ent = out.entropy[row][batch.completion_mask[row]].detach().double()
        lengths.append(int(ent.numel()))
        means.append(float(ent.mean()))
        if ent.numel() > 1:
            within.append(float(ent.std()))
    return {
        "completions": len(lengths),
        "mean_len": statistics.mean(lengths),
        "entropy_mean": statistics.mean(means),
        "within_sd": statistics.mean(within),
        "between_sd": statistics.stdev(means),
    }


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers >= 0, e.g. 0,1,2") from None
    if any(x < 0 for x in seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: seeds must be >= 0")
    return seeds


def main(argv: list[str] | None = None) -> int:
    from study.grid import REGIMES
    from train.config.cli import parse_args
    from train.model import load_model_and_tokenizer
    from train.rollout import rollout
    from train.tasks import make_task
    from train.tasks.registry import TASK_OPTIONS

    p = argparse.ArgumentParser(prog=common.prog("study_task"), description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--regime", default="decisive", choices=sorted(REGIMES))
    p.add_argument("--seeds", default="0,1,2,3,4", type=_seeds, help="comma-separated seeds, each an integer >= 0")
    p.add_argument("--prompts", type=int_at_least(1), default=8, help="training prompts for the entropy profile")
    p.add_argument(
        "--before-from",
        type=Path,
        nargs="*",
        default=[],
        help="run dirs of the regime (any arm): their first held-out evaluation",
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    for d in args.before_from:  # before the model loads: a run folder with the files read below
        missing = [f for f in ("metrics.jsonl", "config.json") if not (d / f).is_file()]
        if missing:
            p.error(f"--before-from {d}: not a run folder (no {' or '.join(missing)})")
    check_out(p, "--out", args.out)
    overrides = REGIMES[args.regime]
    cfg, _ = parse_args([a for k, v in overrides.items() if k != "use_vllm" for a in (f"--{k}", v)])
    task = make_task(cfg.task, **{k: getattr(cfg, k) for k in TASK_OPTIONS})
    before_from = " ".join(map(str, args.before_from))
    command = f"python -m benchmarks.study_task --regime {args.regime}" + (
        f" --before-from {before_from}" * bool(before_from)
    )
    lines = [f"# Task properties of the `{args.regime}` regime", "", f"Command: `{command}`", ""]
    lines += [
        "| seed | distinct held-out problems (of eval_problems) | base greedy accuracy (+- SE) |",
        "|---|---|---|",
    ]
    befores = {}
    for d in args.before_from:  # a run's first held-out evaluation (step 0, before training), from its metrics.jsonl
        records = map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
        first = next(r for r in records if r.get("event") == "eval")
        seed = json.loads((d / "config.json").read_text())["train"]["seed"]
        befores[seed] = f"{first['eval_acc']:.3f} +- {first['eval_acc_se']:.3f} (n={first['eval_n']})"
    for seed in args.seeds:
        n = len({q.question for q in task.heldout(cfg.eval_problems, seed)})
        lines.append(f"| {seed} | {n} of {cfg.eval_problems} | {befores.get(seed, 'not measured')} |")
    torch.manual_seed(0)
    model, tok = load_model_and_tokenizer(cfg.model, torch.device("cpu"), torch.float32, progress=False)
    import random

    problems = task.sample(args.prompts, random.Random(0))
    system = cfg.system_prompt if cfg.system_prompt is not None else task.system_prompt
    batch = rollout(model, tok, problems, group_size=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
                    temperature=cfg.temperature, top_p=cfg.top_p, system_prompt=system)  # fmt: skip
    prof = entropy_profile(model, tok, batch, cfg.temperature)
    hit = float((batch.completion_mask.sum(1) >= cfg.max_new_tokens).float().mean())
    lines += ["", f"Sampled completions of the base policy (HF generate, T={cfg.temperature}, {args.prompts} training "
              f"prompts x {cfg.group_size}, max {cfg.max_new_tokens} new tokens): {prof['completions']} completions, "
              f"mean length {prof['mean_len']:.1f} tokens ({hit:.0%} reach the limit), success rate "
              f"{float(batch.correct.float().mean()):.3f}; token entropy (nats) mean {prof['entropy_mean']:.3f}, SD "
              f"inside a completion {prof['within_sd']:.3f} (mean over completions), SD of the completions' mean "
              f"entropy {prof['between_sd']:.3f}."]  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if math.isfinite(prof["within_sd"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
