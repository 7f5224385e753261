"""The LM head of a Hugging Face causal LM, found once for every caller (the bundled trainer, the TRL integration):
its weight and bias through PEFT and DDP wrappers and tied embeddings, and the head options some models apply to
their logits (Cohere's `logit_scale`, Falcon-H1's `lm_head_multiplier`, Granite's `logits_scaling`, Gemma 2/3's
`final_logit_softcapping`), read from the text model's config (a multimodal model keeps them in `text_config`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class LMHead:
    """logits = softcap(scale * (hidden @ weight.T + bias)), softcap(x) = c * tanh(x / c) when `softcap` is set."""

    weight: Tensor  # [V, D] (a DTensor's full tensor under FSDP2)
    bias: Tensor | None
    scale: float = 1.0  # multiplies the logits (`head_scale`)
    softcap: float | None = None  # Gemma 2/3/3n/4 final_logit_softcapping

    def options(self) -> dict:
        """The keywords of `linear_logprobs` / `sgrpo_loss` that apply this head: `bias`, and the model's fields of
        `sgrpo_kernels.HeadOptions` (`logit_scale`, `softcap`; the caller adds its own temperature). Splat them:
        `linear_logprobs(hidden, head.weight, targets, temperature=t, **head.options())`."""
        return {"bias": self.bias, "logit_scale": self.scale, "softcap": self.softcap}


def unwrap(model):
    """The Hugging Face model inside DDP (`.module`) and PEFT (`.get_base_model()`) wrappers."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def lm_head(model) -> LMHead:
    """The head of `model` (any causal LM with `get_output_embeddings()`, wrapped or not). Tied embeddings give the
    embedding matrix (the same Parameter). FSDP2 shards are gathered (`full_tensor()`)."""
    base = unwrap(model)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if head is None or not hasattr(head, "weight"):
        raise ValueError(
            f"{type(base).__name__} has no output embeddings (get_output_embeddings() is None): not a causal LM head"
        )
    weight, bias = head.weight, getattr(head, "bias", None)
    if weight.numel() == 0 and hasattr(weight, "ds_id"):  # a DeepSpeed ZeRO-3 partition: gathered only in a forward
        raise NotImplementedError(
            f"{type(base).__name__}'s LM head weight is partitioned by DeepSpeed ZeRO-3 (its local tensor is empty "
            "outside the module's forward): the fused head cannot read it yet; use ZeRO-2, DDP or FSDP2"
        )
    if hasattr(weight, "full_tensor"):  # FSDP2 DTensor
        weight = weight.full_tensor()
        bias = bias.full_tensor() if bias is not None and hasattr(bias, "full_tensor") else bias
    cfg = getattr(base, "config", None)
    if hasattr(cfg, "get_text_config"):  # a multimodal model: its language model's settings
        cfg = cfg.get_text_config()
    softcap = getattr(cfg, "final_logit_softcapping", None)
    return LMHead(weight=weight, bias=bias, scale=head_scale(cfg), softcap=float(softcap) if softcap else None)


def head_scale(cfg) -> float:
    """The factor a model's forward multiplies its logits by, before any softcap: the first of Cohere's `logit_scale`
    (also `output_multiplier`), Falcon-H1's `lm_head_multiplier` and `logits_scaling` that the (text) config sets;
    Granite and MiniCPM3 divide their logits by `logits_scaling`, HyperCLOVA X multiplies them by it (the order and
    the rule of TRL 1.16's fused LM head). 1.0 when none is set."""
    for name in ("logit_scale", "output_multiplier", "lm_head_multiplier"):
        value = getattr(cfg, name, None)
        if value is not None:
            return float(value)
    scaling = getattr(cfg, "logits_scaling", None)
    if scaling is None:
        return 1.0
    return float(scaling) if getattr(cfg, "model_type", None) == "hyperclovax" else 1.0 / float(scaling)
