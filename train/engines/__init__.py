"""Rollout engines (docs/rollouts.md): the interface (`RolloutEngine`, base.py), HF generate on the trainer's model
(hf.py) and vLLM (vllm.py); `make_engine` picks one for a run (`--use-vllm auto|on|off`)."""

from __future__ import annotations

import sys

import torch

from ..config.inert import fallback_warnings
from ..errors import Refused
from .base import Generated, RolloutEngine
from .hf import HFEngine, eos_ids

__all__ = ["Generated", "HFEngine", "RolloutEngine", "make_engine"]


def _why_not_vllm(cfg, device: torch.device, dist) -> str | None:
    """Why this run cannot use vLLM (None: it can try)."""
    if dist.enabled:
        # vLLM's in-process engine initializes torch.distributed itself (a world of one), which collides with the
        # torchrun job's process group; an engine per rank would need vLLM's external-launcher mode, one engine per
        # rank sharing the job's group: not built. Each rank would also take its own KV cache and threads.
        return f"a torchrun job of {dist.world} processes (one vLLM engine per rank is not supported)"
    if device.type not in ("cpu", "cuda"):
        return f"device {device.type} (vLLM runs on CPU and CUDA)"
    if cfg.model == "tiny":
        return "model 'tiny' (its character tokenizer and 8-wide attention heads are not a vLLM model)"
    return None


def check_vllm_first(cfg, device: torch.device, dist) -> None:
    """`--use-vllm on`: what can be known before the model loads (a torchrun job, the device, the model; vllm not
    installed) refused now, not after minutes of loading. (vllm is not imported here: its import, and what it sets,
    stay where they always were, after the model loads.)"""
    if cfg.use_vllm != "on":
        return
    why = _why_not_vllm(cfg, device, dist)
    if why is not None:
        raise Refused(f"--use-vllm on: not with {why}; use --use-vllm off (or auto)")
    from .vllm import INSTALL, vllm_installed

    if not vllm_installed():
        raise Refused(f"--use-vllm on: vllm is not installed in this environment; install it with: {INSTALL}")


def make_engine(cfg, model, tok, device: torch.device, dist) -> RolloutEngine:
    """`--use-vllm off`: HF generate. `on`: vLLM, or Refused with the reason. `auto`: vLLM when it is installed and
    starts here, else HF generate (the reason printed). The choice is printed either way."""
    from .vllm import VLLMEngine, engine_dtype, vllm_installed

    why = None if cfg.use_vllm != "off" else "--use-vllm off"
    if why is None:
        why = _why_not_vllm(cfg, device, dist)
        if why is not None and cfg.use_vllm == "on":
            raise Refused(f"--use-vllm on: not with {why}; use --use-vllm off (or auto)")
    if why is None and cfg.use_vllm == "auto" and not vllm_installed():
        why = "vllm is not installed (docs/rollouts.md)"
    if why is None:
        try:
            dtype, chosen = engine_dtype(cfg.vllm_dtype, device)
            return VLLMEngine(
                model, tok, eos_ids(tok, model), dtype, cfg.vllm_kv_cache_gb, cfg.seed,
                max_model_len=cfg.vllm_max_model_len or None, why=chosen,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 -- auto: any failure to start falls back to HF generate, with why
            if cfg.use_vllm == "on":
                if isinstance(exc, Refused):
                    raise
                raise Refused(f"--use-vllm on: the vLLM engine did not start ({type(exc).__name__}: {exc})") from exc
            why = f"vLLM did not start ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    print(f"rollout engine: HF generate ({why})" if cfg.use_vllm != "off" else "rollout engine: HF generate")
    for line in fallback_warnings(cfg) if cfg.use_vllm == "auto" else ():  # (off: warned when parsed)
        print(line, file=sys.stderr)
    return HFEngine(model, tok)
