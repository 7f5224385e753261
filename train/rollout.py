"""Rollouts: G sampled completions per prompt, tokenized for the loss, plus rewards; the `Batch` they make.

HF `generate` on any device; a vLLM engine on CUDA when vllm is installed (its weights are synced from the trainer
after each optimizer step, and log-probs are always recomputed by the trainer, never taken from vLLM).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from .model import decoder
from .rewards import correctness_rewards, extract_answer, format_reward
from .tasks import Problem


@dataclass(frozen=True)
class Sampling:
    """How the training rollouts sample (`rollout`'s keyword arguments; the loss uses the same temperature)."""

    group_size: int
    max_new_tokens: int
    temperature: float
    top_p: float
    system_prompt: str | None
    format_weight: float

    @classmethod
    def of(cls, cfg, system_prompt: str | None, group_size: int | None = None, format_weight: float = 0.0):
        """The sampling of a trainer configuration (`cfg.group_size` unless `group_size` is given)."""
        n = cfg.group_size if group_size is None else group_size
        return cls(n, cfg.max_new_tokens, cfg.temperature, cfg.top_p, system_prompt, format_weight)

    def kwargs(self) -> dict:
        """`rollout`'s keyword arguments."""
        return dataclasses.asdict(self)


@dataclass
class Batch:
    """B * G completions; rows g*G .. g*G+G-1 belong to prompt g (the RL layer's group layout)."""

    prompt_ids: Tensor  # (N, P) left-padded
    prompt_mask: Tensor  # (N, P)
    completion_ids: Tensor  # (N, T) right-padded; the first EOS is kept (the policy learns to stop)
    completion_mask: Tensor  # (N, T) bool
    texts: list[str]
    rewards: Tensor  # (N,) float32
    correct: Tensor  # (N,) bool


def chat_prompts(tokenizer, problems: list[Problem], system_prompt: str | None) -> list[str]:
    out = []
    for p in problems:
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": "user", "content": p.prompt}
        ]
        out.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    return out


def completion_mask(ids: Tensor, eos_ids: set[int]) -> Tensor:
    """Valid tokens: everything up to and including the first EOS of each row."""
    is_eos = torch.zeros_like(ids, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= ids == e
    after = (is_eos.long().cumsum(1) - is_eos.long()) > 0  # strictly after the first EOS
    return ~after


def eos_ids(tokenizer, model) -> set[int]:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, list):
        ids.update(gen_eos)
    return {i for i in ids if i is not None}


def shared_prompt_cache(model, ids: Tensor, mask: Tensor, n: int):
    """The KV cache of every prompt but its last token, computed once per prompt and repeated `n` times: generate
    then samples the n completions of a prompt without running the prompt n times (for G = 8 and a 27-token prompt
    that halves the rollout's compute). Positions follow the left padding, as generate's own would; the completions
    are the ones generate gives without the shared cache (same numbers; tested)."""
    from transformers import DynamicCache

    dec = decoder(model)
    cache = DynamicCache(config=dec.config)
    position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)  # as generate numbers left-padded prompts
    dec(
        input_ids=ids[:, :-1],
        attention_mask=mask[:, :-1],
        position_ids=position_ids[:, :-1],
        past_key_values=cache,
        use_cache=True,
    )
    cache.batch_repeat_interleave(n)
    return cache


@torch.no_grad()
def hf_generate(
    model,
    tokenizer,
    prompts: list[str],
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    greedy: bool = False,
    share_prompts: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """-> prompt_ids (len(prompts)*n, P), prompt_mask, completion_ids (len(prompts)*n, T) with pad after EOS.
    With n > 1 (and `share_prompts`), each prompt runs once and its KV cache is repeated n times."""
    device = next(model.parameters()).device
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    was_training = model.training
    model.eval()
    cache = shared_prompt_cache(model, ids, mask, n) if share_prompts and n > 1 and ids.shape[1] > 1 else None
    ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
    kwargs = (
        {"do_sample": False} if greedy else {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
    )
    if cache is not None:
        kwargs["past_key_values"] = cache
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=sorted(eos_ids(tokenizer, model)),
        **kwargs,
    )
    model.train(was_training)
    return ids, mask, out[:, ids.shape[1] :]


class VLLMEngine:
    """Rollouts from vLLM (CUDA only). Weights are pushed from the trainer's model after every optimizer step."""

    def __init__(self, model, model_path: str, gpu_memory_utilization: float = 0.3):
        from vllm import LLM  # optional dependency

        self.llm = LLM(model=model_path, gpu_memory_utilization=gpu_memory_utilization, enforce_eager=True)
        self.sync(model)

    def sync(self, model) -> None:
        state = model.get_base_model().state_dict() if hasattr(model, "get_base_model") else model.state_dict()
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        runner.model.load_weights(state.items())

    def generate(
        self, prompts: list[str], n: int, max_new_tokens: int, temperature: float, top_p: float, greedy: bool = False
    ) -> list[list[int]]:
        from vllm import SamplingParams

        params = SamplingParams(n=n, max_tokens=max_new_tokens, temperature=0.0 if greedy else temperature, top_p=top_p)
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        return [list(c.token_ids) for o in outs for c in o.outputs]


def _pad_right(rows: list[list[int]], pad: int, device) -> Tensor:
    width = max(1, max(len(r) for r in rows))
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=device)


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
    engine: VLLMEngine | None = None,
) -> Batch:
    prompts = chat_prompts(tokenizer, problems, system_prompt)
    eos = eos_ids(tokenizer, model)
    if engine is None:
        p_ids, p_mask, c_ids = hf_generate(
            model, tokenizer, prompts, group_size, max_new_tokens, temperature, top_p, greedy
        )
    else:
        device = next(model.parameters()).device
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        p_ids = enc["input_ids"].repeat_interleave(group_size, 0).to(device)
        p_mask = enc["attention_mask"].repeat_interleave(group_size, 0).to(device)
        c_ids = _pad_right(
            engine.generate(prompts, group_size, max_new_tokens, temperature, top_p, greedy),
            tokenizer.pad_token_id,
            device,
        )
    c_mask = completion_mask(c_ids, eos)
    texts = tokenizer.batch_decode(torch.where(c_mask, c_ids, tokenizer.pad_token_id), skip_special_tokens=True)
    answers = [p.answer for p in problems for _ in range(group_size)]
    rewards, correct = score(texts, answers, format_weight)
    return Batch(p_ids, p_mask, c_ids, c_mask, texts, rewards, correct)


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
