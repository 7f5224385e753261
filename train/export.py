"""OUTPUT_DIR/model/: the trained policy as a Hugging Face folder (config.json, model.safetensors,
generation_config.json and the tokenizer's files), loadable with `AutoModelForCausalLM.from_pretrained`, servable by
vLLM, pushable to the Hub. Written at the end of a finished run (`--save-model`, on by default); the checkpoint for
--resume stays OUTPUT_DIR/checkpoint/state.pt (train/run/checkpoint.py). Not written at --save-every checkpoints: for
SmolLM2-135M that would be another 540 MB per checkpoint, and the checkpoint already holds the weights.

LoRA runs are written merged: the adapters folded into the base weights (peft's merge_and_unload, on a copy), one
plain model; the adapters are not written separately. The folder is written to model.tmp/ and renamed over model/,
so a crash never leaves a half-written model/."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

MODEL_DIR = "model"


def plain_model(model):
    """The model to save: a copy with LoRA adapters merged (the training model is left as it is), else the model."""
    if hasattr(model, "merge_and_unload"):  # a peft model
        return copy.deepcopy(model).merge_and_unload()
    return model


def export_model(model, tok, out_dir: Path) -> Path:
    """Write `model` (and `tok` when it can save itself: the tiny test model's character tokenizer cannot) to
    OUTPUT_DIR/model/ as safetensors; returns the folder."""
    out_dir = Path(out_dir)
    final, tmp = out_dir / MODEL_DIR, out_dir / (MODEL_DIR + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    from transformers.utils import logging as hf_logging

    plain = plain_model(model)
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # its "Writing model shards" bar: the trainer prints one line instead
    try:
        plain.save_pretrained(tmp, safe_serialization=True)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    if hasattr(tok, "save_pretrained"):
        tok.save_pretrained(tmp)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def folder_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 2**20
