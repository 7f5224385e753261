"""The HF-generate engine: the trainer's own model samples (any device); nothing to sync."""

from __future__ import annotations

import torch
from torch import Tensor

from ..model import autocast, autocasting, cache_kwargs, decoder
from .base import Generated


def eos_ids(tokenizer, model) -> set[int]:
    """The token ids that end a completion: the tokenizer's EOS and the generation config's."""
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
        **cache_kwargs(model, cache),
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
    *,
    top_k: int = 0,
    min_p: float = 0.0,
    logprobs: list | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """-> prompt_ids (len(prompts)*n, P), prompt_mask, completion_ids (len(prompts)*n, T) with pad after EOS.
    With n > 1 (and `share_prompts`), each prompt runs once and its KV cache is repeated n times. `logprobs`: a list
    that gets the sampled tokens' log-probs [N, T] appended (`sampled_logprobs`; 0 after each completion's EOS)."""
    device = next(model.parameters()).device
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    was_training = model.training
    model.eval()
    sample = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": top_k}
    kwargs = {"do_sample": False} if greedy else sample
    if min_p and not greedy:  # (HF applies it after top_k / top_p; vLLM and the ops before: setup refuses the mix)
        kwargs["min_p"] = min_p
    with autocast(model):  # --mixed-precision: the decoder computes as in the trainer's forward
        cache = shared_prompt_cache(model, ids, mask, n) if share_prompts and n > 1 and ids.shape[1] > 1 else None
        ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
        if cache is not None:
            kwargs |= cache_kwargs(model, cache)
        if logprobs is not None:
            kwargs |= {"output_scores": True, "return_dict_in_generate": True}
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=sorted(eos_ids(tokenizer, model)),
            **kwargs,
        )
    model.train(was_training)
    if logprobs is None:
        return ids, mask, out[:, ids.shape[1] :]
    completion = out.sequences[:, ids.shape[1] :]
    logprobs.append(sampled_logprobs(out.scores, completion, eos_ids(tokenizer, model)))
    return ids, mask, completion


def sampled_logprobs(scores: tuple[Tensor, ...], completion: Tensor, eos: set[int]) -> Tensor:
    """[N, T] log-probs of the sampled tokens under the distribution generate drew them from: `scores` are its
    processed logits of each step (temperature, top-k / top-p / min-p applied; -inf outside the support); 0 after
    each completion's first EOS (padding, as vLLM's)."""
    steps = [torch.log_softmax(s.float(), -1).gather(-1, completion[:, t : t + 1]) for t, s in enumerate(scores)]
    logp = torch.cat(steps, 1)
    is_eos = torch.isin(completion, torch.tensor(sorted(eos), device=completion.device))
    after = (is_eos.long().cumsum(1) - is_eos.long()) > 0
    return logp.masked_fill(after, 0.0)


class HFEngine:
    """Rollouts by `model.generate` on the trainer's own model (so always in sync, and no sampler log-probs: the
    trainer's forward is the sampler). Under `--mixed-precision bf16` it is not quite: generate's bf16 KV-cache decode
    and LM head differ from the loss's forward (fp32 head) by ~1e-2 in log-prob, so the sampled tokens' log-probs
    come back as a vLLM engine's do, and the same mismatch logging and correction (`--tis-cap`) apply."""

    name = "hf"

    def __init__(self, model, tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer

    def generate(
        self, prompts: list[str], n: int, max_new_tokens: int, temperature: float, top_p: float, greedy: bool = False,
        *, top_k: int = 0, min_p: float = 0.0,
    ) -> Generated:  # fmt: skip
        logprobs = [] if autocasting(self.model) and not greedy else None
        _, _, c_ids = hf_generate(self.model, self.tokenizer, prompts, n, max_new_tokens, temperature, top_p, greedy,
                                  top_k=top_k, min_p=min_p, logprobs=logprobs)  # fmt: skip
        return Generated(c_ids, logprobs[0] if logprobs else None)

    def sync(self, model) -> None:
        self.model = model  # the same object the trainer updates: nothing to copy
