"""The policy as a Hugging Face folder (config.json, model.safetensors, generation_config.json and the tokenizer's
files), loadable with `AutoModelForCausalLM.from_pretrained` and by vLLM. One writer, `write_hf_folder`, for its two
uses:

- OUTPUT_DIR/model/ (`export_model`), written at the end of a finished run (`--save-model`, on by default); the
  checkpoint for --resume stays OUTPUT_DIR/checkpoint/state.pt (train/run/checkpoint.py). Not written at --save-every
  checkpoints: for SmolLM2-135M that would be another 540 MB per checkpoint, and the checkpoint already holds the
  weights. Written to model.tmp/ (a folder the export creates itself: a link or leftover of that name is removed, never
  written through) and renamed over model/, so a crash, a full disk or a signal never leaves a half-written model/:
  the previous one, or none, stays. `run.checkpoint.export_finished` says what a failed export left (the run is
  checkpointed).
- the folder the vLLM rollout engine starts from (train/engines/vllm.py), whose weight syncs send `merged_state` too.

The weights are the model's own, in its dtype. A model de-quantized from a GGUF (the default SmolLM2) still carries
the loader's `quantization_config` (quant_method "gguf"), which would mark the folder as a quantized checkpoint
(vLLM then refuses it): it is left out. LoRA runs are written merged: each adapted weight is base + scale * B @ A,
computed beside the trainer's model (which is not merged, copied or touched); the adapters are not written
separately."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import torch

MODEL_DIR = "model"


def base_model(model):
    """The transformers model under a peft wrapper (the model itself without one)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def merged_state(model) -> dict[str, torch.Tensor]:
    """The model's weights as a plain (LoRA-free) checkpoint, HF names: with peft, each adapted layer's base weight
    plus its delta (scale * B @ A), computed without merging into the trainer's model (no round-off left behind)."""
    base = base_model(model)
    if not hasattr(model, "peft_config"):
        return dict(base.state_dict())
    from peft.tuners.lora import LoraLayer

    deltas = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            for adapter in module.active_adapters:
                d = module.get_delta_weight(adapter).detach()
                deltas[name] = deltas[name] + d if name in deltas else d
    state = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        clean = name.replace(".base_layer.", ".")
        module = clean.rsplit(".", 1)[0]
        if clean.endswith(".weight") and module in deltas:
            tensor = tensor + deltas[module].to(tensor.dtype)
        state[clean] = tensor
    return state


def plain_config(model):
    """A copy of the model's config as a plain checkpoint's: no `quantization_config` (a GGUF-loaded model's weights
    are de-quantized floats), the class as `architectures` (a GGUF-derived config may not name it; vLLM needs it) and
    the weights' dtype."""
    base = base_model(model)
    config = base.config.__class__.from_dict(base.config.to_dict())
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(base).__name__]
    config.dtype = next(base.parameters()).dtype
    return config


def write_hf_folder(model, tok, folder: Path) -> Path:
    """Write `model` (LoRA merged) and `tok` (when it can save itself: the tiny test model's character tokenizer
    cannot) to `folder` as a Hugging Face folder; returns it."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = plain_config(model)
    config.save_pretrained(folder)
    state = merged_state(model)
    if getattr(config, "tie_word_embeddings", False):  # one tensor, stored once (the loader ties the head itself)
        state.pop("lm_head.weight", None)
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    gen = getattr(base_model(model), "generation_config", None)
    if gen is not None:
        gen.save_pretrained(folder)
    if hasattr(tok, "save_pretrained"):
        tok.save_pretrained(folder)
    return folder


def _remove(path: Path) -> None:
    """`path` gone: a link or file unlinked (its target untouched), a folder deleted."""
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def export_model(model, tok, out_dir: Path) -> Path:
    """Write `model` and `tok` to OUTPUT_DIR/model/ (through model.tmp/, created new, renamed); returns the folder.
    On any failure model.tmp/ is removed and model/ is as it was."""
    out_dir = Path(out_dir)
    final, tmp = out_dir / MODEL_DIR, out_dir / (MODEL_DIR + ".tmp")
    _remove(tmp)
    os.mkdir(tmp)  # ours: created now (a link planted meanwhile makes this fail, it is never followed)
    old = None
    try:
        write_hf_folder(model, tok, tmp)
        if os.path.isdir(final) and not os.path.islink(final):
            old = out_dir / f"{MODEL_DIR}.tmp-old-{secrets.token_hex(4)}"
            os.rename(final, old)
        else:
            _remove(final)
        os.rename(tmp, final)
    except BaseException:  # (a Ctrl-C between the two renames included) model/ is put back as it was
        if old is not None and not os.path.lexists(final):
            os.rename(old, final)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for stale in out_dir.glob(f"{MODEL_DIR}.tmp-old-*"):  # this one, and any an older trainer left behind
        shutil.rmtree(stale, ignore_errors=True)
    return final


def folder_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 2**20
