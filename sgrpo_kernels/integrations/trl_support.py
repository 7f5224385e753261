"""The sampler's support in SGRPOTrainer: TRL's `top_k`, `top_p`, `min_p` read as the ops' options (docs/ops.md,
"Sampler support"), and TRL's own log-prob computations redone over that support.

TRL 1.16 hands its `GRPOConfig` fields `top_k` (default 0: off), `top_p` (1.0: off) and `min_p` (None: off) to the
sampler: vLLM's `SamplingParams` (colocate and server modes; `min_p=None` sent as 0.0) or transformers'
`GenerationConfig` (`model.generate`, continuous batching), with `generation_kwargs` overriding them in both. The
completions are then draws from the truncated, renormalized distribution, so the log-probs of the loss, the old policy
(`old_per_token_logps`) and the reference (`ref_per_token_logps`) are taken over that support here, at TRL's
temperature, through `linear_logprobs` on the final hidden states (no [B, T, V] logits).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch import Tensor

from sgrpo_kernels.backends import resolve
from sgrpo_kernels.integrations.hf import lm_head
from sgrpo_kernels.ops import linear_logprobs
from sgrpo_kernels.truncation import applies_threshold

__all__ = ["SAMPLER_FIELDS", "check_backend", "sampler_support", "support_logps"]

SAMPLER_FIELDS = ("top_k", "top_p", "min_p")
_EXPECTED = {
    "top_k": "an int >= 1, or 0 / None (off; vLLM's -1 too)",
    "top_p": "a number in (0, 1] (1.0 or None: off)",
    "min_p": "a number in [0, 1) (0.0 or None: off; min_p=1 keeps only the most likely token: use top_k=1)",
}


def _value(name: str, value: object) -> int | float | None:
    """One sampler setting as the ops' option (None: off); ValueError when it is not a setting TRL's samplers take."""
    if name == "top_k":
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < -1:
            raise ValueError
        return int(value) if int(value) >= 1 else None  # 0 (TRL, transformers) and -1 (vLLM): off
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ValueError
    v = float(value)
    if name == "top_p":
        if not 0.0 < v <= 1.0:
            raise ValueError
        return v if v < 1.0 else None
    if not 0.0 <= v < 1.0:
        raise ValueError
    return v if v > 0.0 else None


def sampler_support(args) -> dict:
    """The `linear_logprobs` / `sgrpo_loss` keywords of the sampler `args` (a GRPOConfig) configures: only the settings
    that cut tokens, so that TRL's defaults give {} and every call is made exactly as without this feature. A setting
    in `generation_kwargs` wins over the field, as it does in TRL. A value TRL's samplers would not honour as the
    ops do is refused, naming the field; so is a `temperature` that is not a finite number > 0, and a
    `generation_kwargs` temperature other than it (TRL would sample at one and score at the other)."""
    t = args.temperature
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        raise ValueError(f"SGRPOConfig(temperature={t!r}): expected a finite number > 0 (the sampler's temperature; "
                         "the log-probs divide the logits by it)")
    gen = args.generation_kwargs if isinstance(args.generation_kwargs, dict) else {}
    if "temperature" in gen and gen["temperature"] != t:  # TRL samples at it, but scores at args.temperature
        raise ValueError(
            f"SGRPOConfig(generation_kwargs={{'temperature': {gen['temperature']!r}}}, temperature={t!r}): TRL samples "
            "at generation_kwargs' temperature while the log-probs divide the logits by `temperature`, so they would "
            f"score another distribution than the one sampled; set temperature={gen['temperature']!r} and leave it "
            "out of generation_kwargs"
        )
    out: dict = {}
    for name in SAMPLER_FIELDS:
        given = gen.get(name, getattr(args, name))
        where = f"generation_kwargs={{{name!r}: {given!r}}}" if name in gen else f"{name}={given!r}"
        try:
            v = _value(name, given)
        except ValueError:
            raise ValueError(f"SGRPOConfig({where}): expected {_EXPECTED[name]}") from None
        if v is not None:
            out[name] = v
    if not args.use_vllm and "top_p" in out and "min_p" in out:
        raise ValueError(
            f"SGRPOConfig(top_p={out['top_p']!r}, min_p={out['min_p']!r}) with transformers' generate (use_vllm="
            "False): it applies min_p after top_p, while the log-probs follow vLLM's order (min_p, then top_k, then "
            "top_p over what min_p kept), so the support would differ from the one sampled; set use_vllm=True or only "
            "one of top_p and min_p"
        )
    return out


def check_backend(support: dict, device: torch.device) -> None:
    """Refuse, at the trainer's start, a kernel backend that does not apply the support (rather than at the first
    loss)."""
    if not support:
        return
    name = resolve(None, device)
    if not applies_threshold(name):
        given = ", ".join(f"{k}={v!r}" for k, v in support.items())
        raise ValueError(
            f"SGRPOConfig({given}): sgrpo_kernels' {name!r} backend (for {device.type} tensors) does not apply the "
            "sampler's support yet; expected a backend that does ('torch' or 'triton', e.g. env SGRPO_BACKEND=torch), "
            "or top_k=0, top_p=1.0 and min_p=None"
        )


def support_logps(
    model,
    input_ids: Tensor,  # (B, P + T)
    attention_mask: Tensor,  # (B, P + T)
    logits_to_keep: int,
    *,
    support: dict,
    temperature: float,
    autocast: Callable[[], AbstractContextManager],
    batch_size: int | None = None,
    compute_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """TRL's `_get_per_token_logps_and_entropies` over the sampler's support: the log-prob (B, T) of each of the last
    `logits_to_keep` tokens and, when asked, the entropy (B, T) of the truncated distribution at TRL's temperature;
    0 where the attention mask is 0 (as TRL's fused head). `batch_size` rows per forward, as TRL chunks."""
    n = input_ids.size(0)
    step = batch_size or n
    head = lm_head(model)
    logps, entropies = [], []
    for start in range(0, n, step):
        ids, att = input_ids[start : start + step], attention_mask[start : start + step]
        with autocast():
            out = model(input_ids=ids, attention_mask=att, output_hidden_states=True, logits_to_keep=1,
                        use_cache=False)  # fmt: skip
        hidden = final_hidden(out, model, ids, logits_to_keep, head.weight.dtype)
        targets = ids[:, -logits_to_keep:].masked_fill(att[:, -logits_to_keep:] == 0, -100)
        res = linear_logprobs(hidden, head.weight, targets, temperature=temperature, return_entropy=compute_entropy,
                              **head.options(), **support)  # fmt: skip
        logps.append(res.logp)
        if compute_entropy:
            entropies.append(res.entropy)
    return torch.cat(logps), torch.cat(entropies) if compute_entropy else None


def final_hidden(out, model, input_ids: Tensor, t: int, dtype: torch.dtype) -> Tensor:
    """The final (normed) hidden states (B, t, D) predicting the last `t` tokens of `input_ids`, from a forward with
    output_hidden_states=True, in the head's dtype; a model whose last hidden state is not (B, L, D) (Gemma 3n's AltUp
    stack, for one) is refused by name."""
    hidden = out.hidden_states[-1]
    if hidden.dim() != 3 or tuple(hidden.shape[:2]) != tuple(input_ids.shape):
        name = type(getattr(model, "module", model)).__name__
        raise NotImplementedError(
            f"SGRPOTrainer: {name}'s last hidden state has shape {tuple(hidden.shape)}, not (batch, length, hidden) = "
            f"({input_ids.size(0)}, {input_ids.size(1)}, D): the LM head cannot be applied to it (e.g. Gemma 3n's "
            "AltUp stack); this model is not supported yet with an sgrpo preset (sgrpo_preset=None: TRL's own loss)"
        )
    hidden = hidden[:, -t - 1 : -1]
    return hidden if hidden.dtype == dtype else hidden.to(dtype)
