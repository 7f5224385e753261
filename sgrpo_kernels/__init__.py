"""sgrpo-kernels: fused LM-head log-prob + entropy ops and reference-free GRPO-family losses."""

from sgrpo_kernels import rl
from sgrpo_kernels.backends import BackendUnavailableError, HeadOptions, available_backends
from sgrpo_kernels.ops import LogProbs, LogProbsWithMax, linear_logprobs, logprobs_from_logits
from sgrpo_kernels.rl import sgrpo_loss

__all__ = [
    "BackendUnavailableError",
    "HeadOptions",
    "LogProbs",
    "LogProbsWithMax",
    "available_backends",
    "linear_logprobs",
    "logprobs_from_logits",
    "rl",
    "sgrpo_loss",
]
__version__ = "0.1.0"
