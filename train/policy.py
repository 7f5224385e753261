"""The policy forward: hidden states at the positions that predict each completion token, never logits, and the
forward-only log-probs that the probe, PPO epochs and the reference take from them with the package's op.

`sgrpo_loss` / `linear_logprobs` get these hidden states together with the model's LM head (`lm_head(model)`:
weight, bias, logit scale, softcap), so `[tokens, vocab]` logits are never built.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sgrpo_kernels import linear_logprobs
from sgrpo_kernels.integrations.hf import lm_head

from .batch import Batch
from .distributed import Dist
from .model import autocast, cache_kwargs, decoder


def policy_hidden(model, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """Final (post-norm) hidden states [B, T, D] of the decoder: the policy forward. No logits."""
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # left padding: positions start at the text
    with autocast(model):
        out = decoder(model)(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=False)  # fmt: skip
    return in_model_dtype(model, out.last_hidden_state)


def in_model_dtype(model, hidden: Tensor) -> Tensor:
    """`hidden` in the weights' dtype (an autocast forward's are bf16; the LM head's log-probs are taken in the
    weights' dtype)."""
    return hidden.to(next(model.parameters()).dtype)


def policy_hidden_grouped(
    model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor, group_size: int
) -> Tensor:
    """Hidden states [N, T, D] at the positions that predict each completion token, computing each prompt once.

    The G completions of a group share one prompt: run the B unique prompts (prompt_ids[B, P], left-padded), repeat
    their KV cache G times, then run the N = B * G completions on top of it. Same numbers as running the N full
    sequences (gradients flow through the repeated cache into the prompt's activations), B * P + N * T tokens instead
    of N * (P + T). The hidden state of the last prompt position predicts the first completion token.
    """
    from transformers import DynamicCache

    dec = decoder(model)
    n, t = completion_ids.shape
    pos_p = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=dec.config)
    with autocast(model):
        out = dec(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=pos_p,
            use_cache=True,
            **cache_kwargs(model, cache),
        )
        first = out.last_hidden_state[:, -1:].repeat_interleave(group_size, 0)  # [N, 1, D]
        if t == 1:
            return in_model_dtype(model, first)
        cache.batch_repeat_interleave(group_size)
        mask = torch.cat([prompt_mask.repeat_interleave(group_size, 0), completion_mask.to(prompt_mask.dtype)], 1)
        pos_c = pos_p[:, -1:].repeat_interleave(group_size, 0) + torch.arange(1, t, device=pos_p.device)
        rest = dec(
            input_ids=completion_ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=pos_c,
            **cache_kwargs(model, cache),
            use_cache=True,
        ).last_hidden_state  # [N, T-1, D]
    return in_model_dtype(model, torch.cat([first, rest], 1))


def completion_targets(batch: Batch) -> Tensor:
    """[N, T] completion tokens, -100 (ignore_index) after each completion's end."""
    return torch.where(batch.completion_mask, batch.completion_ids, -100)


def completion_hidden(model, batch: Batch, group_size: int) -> torch.Tensor:
    """Hidden states [N, T, D] at the positions that predict each completion token; each group's shared prompt is
    run once (rows g*G .. g*G+G-1 have the same prompt)."""
    return policy_hidden_grouped(
        model,
        batch.prompt_ids[::group_size],
        batch.prompt_mask[::group_size],
        batch.completion_ids,
        batch.completion_mask,
        group_size,
    )


class PolicyHidden(torch.nn.Module):
    """The policy's forward as a module, (prompt ids/mask, completion ids/mask) -> hidden states [N, T, D]
    (`completion_hidden`). Under torchrun it is wrapped in DistributedDataParallel, so the gradients of the weights
    it holds, the LM head's included (used by `sgrpo_loss` on these hidden states), are averaged across ranks in the
    backward."""

    def __init__(self, model, group_size: int):
        super().__init__()
        self.model, self.group_size = model, group_size

    def forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask) -> Tensor:
        g = self.group_size
        return policy_hidden_grouped(self.model, prompt_ids[::g], prompt_mask[::g], completion_ids, completion_mask, g)


def data_parallel(model, group_size: int, ctx: Dist) -> torch.nn.Module:
    """`PolicyHidden` of `model`; DDP-wrapped in a job of several processes (it checks that every rank holds the same
    weights, and averages the gradients)."""
    module = PolicyHidden(model, group_size)
    if not ctx.enabled:
        return module
    from torch.nn.parallel import DistributedDataParallel

    device = next(model.parameters()).device
    return DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None)


@torch.no_grad()
def token_logprobs(
    model, batch: Batch, temperature: float, backend: str | None, group_size: int, check_targets: bool | None = None,
    support: dict | None = None,
) -> torch.Tensor:  # fmt: skip
    """Forward-only log-probs [N, T] of the completion tokens (no autograd state, no logits). `check_targets`: as in
    `linear_logprobs` (None = env SGRPO_CHECK_TARGETS, default on; one host sync). `support`: the sampler's
    (`Sampling.support()`: top_k / top_p / min_p of `linear_logprobs`; None or {} = the full softmax)."""
    hidden = completion_hidden(model, batch, group_size)
    head = lm_head(model)
    logp, _ = linear_logprobs(
        hidden,
        head.weight,
        completion_targets(batch),
        temperature=temperature,
        return_entropy=False,
        backend=backend,
        check_targets=check_targets,
        **head.options(),  # bias, logit scale, softcap of this model's head
        **(support or {}),
    )
    return logp


def reference_logprobs(
    model, ref_model, batch: Batch, temperature: float, backend: str | None, group_size: int, check_targets=None,
    support: dict | None = None,
) -> Tensor:  # fmt: skip
    """The reference policy's completion log-probs for the KL presets: the frozen reference model, or with LoRA
    (`ref_model` None) the policy itself with its adapters disabled (the base model: no second copy resident)."""
    if ref_model is not None:
        return token_logprobs(ref_model, batch, temperature, backend, group_size, check_targets, support)
    with model.disable_adapter():
        return token_logprobs(model, batch, temperature, backend, group_size, check_targets, support)
