"""Rollouts: G sampled completions per prompt, tokenized for the loss, plus rewards; the `Batch` they make.

The completions come from a rollout engine (train/engines/: HF generate on the trainer's model, or vLLM, whose weights
follow the trainer's after every optimizer step). The loss always recomputes the log-probs with the trainer's
forward; the sampler's own log-probs (vLLM's) are kept in the batch to measure and correct the mismatch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .batch import Batch, Sampling, completion_mask
from .engines import HFEngine, RolloutEngine
from .engines.hf import eos_ids, hf_generate, shared_prompt_cache
from .rewards import correctness_rewards, extract_answer, format_reward
from .tasks import Problem

__all__ = [  # hf_generate, shared_prompt_cache, eos_ids: the HF engine's, importable from here as they always were
    "Batch",
    "Sampling",
    "PLAIN_PROMPT",
    "chat_prompts",
    "completion_mask",
    "concat_batches",
    "eos_ids",
    "hf_generate",
    "majority",
    "rollout",
    "score",
    "shared_prompt_cache",
]


# A model whose tokenizer has no chat template (a pre-trained base model, e.g. a GGUF file without one) gets each
# problem as plain text in this form: the system prompt (if any), a blank line, then the question and an answer cue.
PLAIN_PROMPT = "{system}Question: {question}\nAnswer:"


def chat_prompts(tokenizer, problems: list[Problem], system_prompt: str | None) -> list[str]:
    """The text the model is given for each problem: the tokenizer's chat template (system + user message, generation
    prompt added), or PLAIN_PROMPT when the tokenizer has none."""
    if getattr(tokenizer, "chat_template", "") is None:
        system = f"{system_prompt}\n\n" if system_prompt else ""
        return [PLAIN_PROMPT.format(system=system, question=p.prompt) for p in problems]
    out = []
    for p in problems:
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": "user", "content": p.prompt}
        ]
        out.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    return out


def score(texts: list[str], answers: list[str], format_weight: float) -> tuple[Tensor, Tensor]:
    correct = torch.tensor([r > 0 for r in correctness_rewards(texts, answers)])  # code: sandboxed, in parallel
    rewards = correct.float()
    if format_weight:
        rewards = rewards + format_weight * torch.tensor([format_reward(t) for t in texts])
    return rewards, correct


def rollout(
    model,
    tokenizer,
    problems: list[Problem],
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    system_prompt: str | None = None,
    format_weight: float = 0.0,
    greedy: bool = False,
    engine: RolloutEngine | None = None,
    top_k: int = 0,
    min_p: float = 0.0,
) -> Batch:
    """`group_size` completions of each problem from `engine` (None: HF generate on `model`), scored."""
    engine = HFEngine(model, tokenizer) if engine is None else engine
    prompts = chat_prompts(tokenizer, problems, system_prompt)
    device = next(model.parameters()).device
    out = engine.generate(prompts, group_size, max_new_tokens, temperature, top_p, greedy, top_k=top_k, min_p=min_p)
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    p_ids = enc["input_ids"].to(device).repeat_interleave(group_size, 0)
    p_mask = enc["attention_mask"].to(device).repeat_interleave(group_size, 0)
    c_ids = out.completion_ids.to(device)
    c_mask = completion_mask(c_ids, eos_ids(tokenizer, model))
    texts = tokenizer.batch_decode(torch.where(c_mask, c_ids, tokenizer.pad_token_id), skip_special_tokens=True)
    answers = [p.answer for p in problems for _ in range(group_size)]
    rewards, correct = score(texts, answers, format_weight)
    sampler_logp = None if out.logprobs is None else out.logprobs.to(device)
    return Batch(p_ids, p_mask, c_ids, c_mask, texts, rewards, correct, sampler_logp)


def concat_batches(batches: list[Batch], pad_id: int) -> Batch:
    """One Batch from several rollouts: prompts left-padded, completions right-padded to the widest."""
    if len(batches) == 1:
        return batches[0]
    p_width = max(b.prompt_ids.shape[1] for b in batches)
    c_width = max(b.completion_ids.shape[1] for b in batches)

    def pad(x: Tensor, width: int, value, left: bool) -> Tensor:
        extra = width - x.shape[1]
        return torch.nn.functional.pad(x, (extra, 0) if left else (0, extra), value=value)

    return Batch(
        prompt_ids=torch.cat([pad(b.prompt_ids, p_width, pad_id, True) for b in batches]),
        prompt_mask=torch.cat([pad(b.prompt_mask, p_width, 0, True) for b in batches]),
        completion_ids=torch.cat([pad(b.completion_ids, c_width, pad_id, False) for b in batches]),
        completion_mask=torch.cat([pad(b.completion_mask, c_width, False, False) for b in batches]),
        texts=[t for b in batches for t in b.texts],
        rewards=torch.cat([b.rewards for b in batches]),
        correct=torch.cat([b.correct for b in batches]),
        sampler_logp=None
        if any(b.sampler_logp is None for b in batches)
        else torch.cat([pad(b.sampler_logp, c_width, 0.0, False) for b in batches]),
    )


def majority(texts: list[str]) -> str | None:
    """Most common extracted answer (first seen wins ties); None when no completion has an answer."""
    votes: dict[str, int] = {}
    for t in texts:
        a = extract_answer(t)
        if a is not None:
            key = a.rstrip("0").rstrip(".") if "." in a else a
            votes[key] = votes.get(key, 0) + 1
    return max(votes, key=votes.get) if votes else None
