"""The loss inputs' checks, shared by ``policy_loss`` and ``sgrpo_loss`` (which runs them before its LM-head
forward, so that a wrong input costs no forward)."""

from __future__ import annotations

from torch import Tensor

from sgrpo_kernels.rl.config import LossConfig
from sgrpo_kernels.validation import check_float_tensor, check_same_device, check_tensor

__all__ = ["check_loss_inputs"]


def check_loss_inputs(config, advantages, like: Tensor, like_name: str, *, entropy=None, old_logp=None, ref_logp=None,
                      token_weights=None, conflict_counts=None, max_logprob=None, sampler_logp=None,
                      policy_weights=None, op_outputs: bool = True) -> Tensor:
    """Check the loss inputs against the ``[B, T]`` (and device) of `like` (``logp``; ``sgrpo_loss``: ``hidden``,
    before its LM-head forward); -> advantages. `op_outputs`: also require what the config needs of the op's outputs
    (entropy, max_logprob), which ``sgrpo_loss`` computes itself. The mask is the caller's to check."""
    if not isinstance(config, LossConfig):
        raise TypeError(f"config must be a LossConfig (see sgrpo_kernels.rl.preset), got {type(config).__name__}")
    b, t = like.shape[:2]
    adv = check_float_tensor("advantages", advantages, (b,), f" ([B], B from {like_name})")
    check_same_device("advantages", adv, like, like_name)
    for name, x in (("entropy", entropy), ("old_logp", old_logp), ("ref_logp", ref_logp),
                    ("token_weights", token_weights), ("max_logprob", max_logprob), ("sampler_logp", sampler_logp),
                    ("policy_weights", policy_weights)):
        if x is not None:
            x = check_float_tensor(name, x, (b, t), f" (the [B, T] of {like_name})")
            check_same_device(name, x, like, like_name)
    if entropy is None and config.needs_entropy and op_outputs:
        raise ValueError(f"entropy [B, T] is required by this config ({config.name!r}: entropy terms or filters)")
    if ref_logp is None and config.needs_ref:
        raise ValueError(f"ref_logp [B, T] is required when config.beta > 0 (beta = {config.beta})")
    if max_logprob is None and config.needs_max_logprob and op_outputs:
        raise ValueError(
            f"max_logprob [B, T] is required when config.prob_compensation is set ({config.prob_compensation!r}): "
            "linear_logprobs(..., return_max_logprob=True) gives it"
        )
    if conflict_counts is not None:
        check_tensor("conflict_counts", conflict_counts)
        if tuple(conflict_counts.shape) != (b,):
            raise ValueError(f"conflict_counts has shape {tuple(conflict_counts.shape)}, expected ({b},)")
    return adv
