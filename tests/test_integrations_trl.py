"""SGRPOTrainer inside TRL's GRPOTrainer, on a tiny random Llama and a character-level tokenizer built in-process (no
downloads): training with several presets and LoRA, parity with TRL's own loss (grpo, cispo, sapo, the sampler
correction's four modes and the off-policy mask), the trust region, conflict weights under TRL's shuffling, the same
update from 2 processes or 2 accumulated micro-batches as from one (fixed completions), the head helper, and the
errors for what TRL cannot serve. Skipped without the `trl` extra."""

from __future__ import annotations

import dataclasses

import pytest
import torch

trl = pytest.importorskip("trl")
pytest.importorskip("datasets")

from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, TrainerCallback  # noqa: E402

import sgrpo_kernels as sk  # noqa: E402
from sgrpo_kernels import reference, rl  # noqa: E402
from sgrpo_kernels.integrations.hf import lm_head  # noqa: E402
from sgrpo_kernels.integrations.trl import SGRPOConfig, SGRPOTrainer  # noqa: E402

CHARS = list("0123456789+-*=/. ?abcdefghijklmnopqrstuvwxyz")


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3, **{c: i + 4 for i, c in enumerate(CHARS)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                  unk_token="<unk>")  # fmt: skip
    tok.padding_side = "left"
    return tok


def model(seed: int = 0, tied: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(CHARS) + 4, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2, pad_token_id=0)  # fmt: skip
    return LlamaForCausalLM(cfg)


def dataset() -> Dataset:
    return Dataset.from_list([{"prompt": f"{a} + {b} =", "answer": str(a + b)} for a in range(6) for b in range(6)])


def reward(completions, answer, **kwargs):
    """A reward with spread on a random model: the answer's first character, plus a little for digits."""
    return [float(c.strip()[:1] == a[:1]) + 0.1 * sum(ch.isdigit() for ch in c) for c, a in zip(completions, answer)]


def trainer(tmp_path, preset="s_grpo", loss="entropy_filter=quantile:0.75", peft_config=None, from_disk=False,
            cls=None, **kw) -> SGRPOTrainer:  # fmt: skip
    args = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                max_completion_length=6, max_steps=2, logging_steps=1, report_to=[], use_cpu=True,
                learning_rate=1e-2, save_strategy="no", beta=0.0, sgrpo_preset=preset, sgrpo_loss=loss,
                seed=0)  # fmt: skip
    args.update(kw)
    m = model()
    if from_disk:  # TRL loads its reference model (beta != 0) by name: give it a saved folder
        m.save_pretrained(tmp_path / "model")
        tokenizer().save_pretrained(tmp_path / "model")
        m = str(tmp_path / "model")
    return (cls or SGRPOTrainer)(model=m, processing_class=tokenizer(), reward_funcs=reward, args=SGRPOConfig(**args),
                                 train_dataset=dataset(), peft_config=peft_config)  # fmt: skip


def trained_params(t: SGRPOTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}


PRESETS = [("s_grpo", "entropy_filter=quantile:0.75"), ("gtpo", "entropy_filter=none"), ("grpo_tc", "")]


@pytest.mark.parametrize(("preset", "loss"), PRESETS)
def test_trains_two_steps(tmp_path, preset, loss):
    t = trainer(tmp_path, preset, loss)
    before = trained_params(t)
    t.train()
    after = trained_params(t)
    assert max((after[k] - before[k]).abs().max().item() for k in before) > 0  # the weights moved
    logs = [h for h in t.state.log_history if "loss" in h]
    assert len(logs) == 2
    for h in logs:  # the RL layer's metrics reach TRL's logs
        for k in ("entropy", "sgrpo/masked_frac", "sgrpo/filtered_frac", "clip_ratio/low_mean", "sgrpo/policy_loss"):
            assert k in h, (k, sorted(h))


def test_trains_with_lora(tmp_path):
    peft = pytest.importorskip("peft")
    t = trainer(tmp_path, peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    before = trained_params(t)
    assert before and all("lora" in k for k in before)
    t.train()
    after = trained_params(t)
    assert max((after[k] - before[k]).abs().max().item() for k in before) > 0


def _inputs(t: SGRPOTrainer, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    n, p, c, v = 8, 5, 6, len(CHARS) + 4
    prompt_ids = torch.randint(4, v, (n, p), generator=g)
    prompt_mask = torch.ones(n, p, dtype=torch.int64)
    prompt_mask[0, :2] = 0  # left padding
    completion_ids = torch.randint(4, v, (n, c), generator=g)
    lengths = torch.tensor([6, 3, 6, 1, 4, 6, 2, 5])
    completion_mask = (torch.arange(c)[None] < lengths[:, None]).long()  # TRL's int64 mask
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": torch.randn(n, generator=g),
            "num_items_in_batch": completion_mask.sum()}  # fmt: skip


def test_parity_with_trl_loss(tmp_path):
    """TRL's loss_type='grpo' (two-sided clip at 0.2, mean over sequences of the token mean, beta 0) and the preset
    'grpo' with beta=0 are the same objective: same loss and gradients on the same batch."""
    # fp32 throughout: GRPOConfig's bf16=True default runs the decoder under bf16 autocast, where the two heads'
    # different casts of the incoming gradient differ by ~1% (bf16 rounding), not by the algorithm
    t = trainer(tmp_path, "grpo", "beta=0", loss_type="grpo", epsilon=0.2, temperature=0.7, bf16=False)
    t.model.train()
    t.current_gradient_accumulation_steps = 1  # (set by Trainer's loop; both losses divide by it)
    _both_losses(t, _inputs(t), atol=1e-5)


def test_conflict_weights_survive_trl_shuffling(tmp_path):
    from trl.trainer.utils import shuffle_sequence_dict

    t = trainer(tmp_path, "gtpo", "entropy_filter=none", temperature=0.1)  # similar completions: shared tokens
    t.model.train()
    batch = next(iter(t.get_train_dataloader()))
    out = t._generate_and_score_completions(batch)
    ids, mask = out["completion_ids"], out["completion_mask"].bool()
    want, counts = rl.conflict_weights(ids, mask, out["advantages"], t.num_generations)  # on the whole groups
    torch.testing.assert_close(out["sgrpo_token_weights"], want)
    assert (want[mask] != 1).any()  # some tokens are in conflict: the comparison below is not trivial
    out["row"] = torch.arange(len(ids))
    torch.manual_seed(3)
    shuffled = shuffle_sequence_dict(out)
    perm = shuffled["row"]
    assert not torch.equal(perm, torch.arange(len(ids)))
    torch.testing.assert_close(shuffled["sgrpo_token_weights"], want[perm])
    torch.testing.assert_close(shuffled["sgrpo_conflict_counts"], counts[perm])
    torch.testing.assert_close(shuffled["completion_ids"], ids[perm])


def test_errors_for_what_trl_cannot_serve(tmp_path):
    with pytest.raises(ValueError, match="beta=0.0 .* differs from the preset 'grpo', beta=0.04"):
        trainer(tmp_path, "grpo", "")
    with pytest.raises(ValueError, match="entropy_filter='adaptive'"):
        trainer(tmp_path, "s_grpo", "entropy_filter=adaptive")
    with pytest.raises(ValueError, match="unknown LossConfig field"):
        trainer(tmp_path, "s_grpo", "entropy_fliter=ln2")
    with pytest.raises(ValueError, match="unknown preset"):
        trainer(tmp_path, "ppo", "")


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"sgrpo_loss": "beta=nan"}, ["sgrpo_loss", "beta=nan", ">= 0.0"]),  # was "must be a Python number, got str"
        ({"sgrpo_loss": "epsilon_low=NaN"}, ["sgrpo_loss", "epsilon_low=nan", ">= 0.0", "< 1.0"]),
        ({"sgrpo_loss": "epsilon_low=5"}, ["sgrpo_loss", "epsilon_low=5", ">= 0.0", "< 1.0"]),
        # TRL's own top-entropy mask, silently not applied under a preset
        ({"top_entropy_quantile": 0.2},
         ["top_entropy_quantile=0.2", "preset 's_grpo'", "sgrpo_loss='top_entropy_quantile=0.2'"]),  # fmt: skip
        # these said "expected a finite number" (the bounds' probe, 1e300, was refused as beyond float32 first)
        ({"sgrpo_loss": "entropy_floor=-1"}, ["sgrpo_loss entropy_floor=-1", "a finite number >= 0.0"]),
        ({"sgrpo_loss": "top_entropy_quantile=1.5"}, ["top_entropy_quantile=1.5", "> 0.0 and <= 1.0"]),
        ({"sgrpo_loss": "max_completion_length=0"}, ["max_completion_length=0", "None or an int >= 1, got 0"]),
        ({"sgrpo_loss": "entropy_fliter=ln2"}, ["sgrpo_loss", "entropy_fliter", "unknown LossConfig field"]),
        ({"sgrpo_loss": "entropy_filter=adaptive"}, ["entropy_filter='adaptive'"]),
        # it failed at the first step instead (the loss gets no rewards or group size from TRL's micro-batches)
        ({"sgrpo_loss": "entropy_filter=coverage"}, ["entropy_filter='coverage'", "whole groups"]),
        ({"sgrpo_preset": "ppo"}, ["sgrpo_preset='ppo'", "expected one of", "s_grpo"]),
        ({"sgrpo_preset": "grpo"}, ["beta=0.0", "beta=0.04", "sgrpo_loss='beta=0.0'"]),
        # TRL's beta was silently replaced by the preset's whenever both were != 0 (the loss used 0.04)
        ({"sgrpo_preset": "grpo", "beta": 0.1}, ["beta=0.1", "beta=0.04", "sgrpo_loss='beta=0.1'"]),
        ({"sgrpo_preset": "grpo", "beta": 0.1, "sgrpo_loss": "epsilon_high=0.3"},
         ["sgrpo_loss='epsilon_high=0.3,beta=0.1'"]),  # fmt: skip
        ({"sgrpo_preset": "grpo", "beta": 0.1, "sgrpo_loss": "beta=0.2"}, ["beta=0.1", "sgrpo_loss beta=0.2"]),
        # was AttributeError: 'NoneType' object has no attribute 'split'
        ({"sgrpo_loss": None}, ["sgrpo_loss=None", "expected a string", "field=value"]),
        # were accepted here and refused by the ops at the first loss step
        ({"temperature": 0.0}, ["temperature=0.0", "finite number > 0"]),
        ({"temperature": -1.0}, ["temperature=-1.0", "finite number > 0"]),
        ({"temperature": float("nan")}, ["temperature=nan", "finite number > 0"]),
        ({"sgrpo_preset": "dr_grpo", "max_completion_length": 256, "sgrpo_loss": "max_completion_length=100"},
         ["max_completion_length=256", "sgrpo_loss max_completion_length=100"]),  # fmt: skip
    ],
)
def test_config_refuses_bad_values_when_constructed(tmp_path, overrides, words):
    """SGRPOConfig refuses a bad preset or override when it is built (not when the trainer is), naming the field,
    the value and the accepted range."""
    from conftest import assert_refused

    kw = {"output_dir": str(tmp_path), "use_cpu": True, "report_to": [], "beta": 0.0, **overrides}
    assert_refused(lambda: SGRPOConfig(**kw), ValueError, words)


def test_config_takes_trls_beta_and_completion_length_where_the_loss_uses_them(tmp_path):
    """A beta != the preset's is used when sgrpo_loss says so too; dr_grpo's normalizer is TRL's max_completion_length
    (it was None: the loss divided by each micro-batch's padded length)."""
    from sgrpo_kernels.integrations.trl import loss_config

    kw = {"output_dir": str(tmp_path), "use_cpu": True, "report_to": []}
    assert loss_config(SGRPOConfig(**kw, sgrpo_preset="grpo", beta=0.1, sgrpo_loss="beta=0.1")).beta == 0.1
    assert loss_config(SGRPOConfig(**kw, sgrpo_preset="grpo", beta=0.04)).beta == 0.04
    dr = SGRPOConfig(**kw, beta=0.0, sgrpo_preset="dr_grpo", max_completion_length=256)
    assert loss_config(dr).max_completion_length == 256
    same = SGRPOConfig(**kw, beta=0.0, sgrpo_preset="dr_grpo", max_completion_length=256,
                       sgrpo_loss="max_completion_length=256")  # fmt: skip
    assert loss_config(same).max_completion_length == 256
    assert loss_config(SGRPOConfig(**kw, beta=0.0, sgrpo_preset="s_grpo")).max_completion_length is None


def test_parity_with_trl_dr_grpo_loss(tmp_path):
    """TRL's loss_type='dr_grpo' divides the token sum by B x max_completion_length; the preset 'dr_grpo' does the same
    with TRL's max_completion_length (10) on a batch padded to 6 tokens (it divided by 6)."""
    t = trainer(tmp_path, "dr_grpo", "", loss_type="dr_grpo", epsilon=0.2, temperature=0.7, bf16=False,
                max_completion_length=10)  # fmt: skip
    t.model.train()
    t.current_gradient_accumulation_steps = 1
    inputs = _inputs(t)
    assert inputs["completion_ids"].size(1) < t.max_completion_length
    _both_losses(t, inputs)


def test_warns_when_the_filter_removes_every_completion(tmp_path):
    t = trainer(tmp_path, "s_grpo", "", max_steps=1)  # the ln 2 filter on a random model (entropy ~3.8 nats)
    with pytest.warns(UserWarning, match="removed every completion"):
        t.train()


def test_lm_head_helper():
    peft = pytest.importorskip("peft")
    tied, untied = model(tied=True), model(tied=False)
    assert lm_head(tied).weight is tied.model.embed_tokens.weight
    assert lm_head(untied).weight is untied.lm_head.weight
    assert lm_head(untied).weight is not untied.model.embed_tokens.weight
    wrapped = peft.get_peft_model(model(tied=False), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    assert lm_head(wrapped).weight is wrapped.get_base_model().lm_head.weight
    biased = model(tied=False)
    biased.lm_head.bias = torch.nn.Parameter(torch.randn(biased.lm_head.out_features))
    assert lm_head(biased).bias is biased.lm_head.bias
    biased.config.logit_scale = 0.5  # Cohere multiplies its logits
    biased.config.final_logit_softcapping = 30.0  # Gemma 2/3
    assert lm_head(biased).options() == {"bias": biased.lm_head.bias, "logit_scale": 0.5, "softcap": 30.0}
    biased.config.logit_scale, biased.config.logits_scaling = None, 4.0  # Granite divides by logits_scaling
    assert lm_head(biased).scale == 0.25
    with pytest.raises(ValueError, match="no output embeddings"):
        lm_head(torch.nn.Linear(2, 2))


def test_lm_head_options_are_the_ops_head_options():
    """Besides the bias, lm_head(model).options() holds fields of HeadOptions only (never the temperature, which the
    caller adds): splatted next to a temperature they give the op with the same keywords spelled out."""
    biased = model(tied=False)
    biased.lm_head.bias = torch.nn.Parameter(torch.randn(biased.lm_head.out_features) * 0.1)
    biased.config.logit_scale, biased.config.final_logit_softcapping = 0.5, 3.0
    head = lm_head(biased)
    opts = head.options()
    assert set(opts) - {"bias"} <= {f.name for f in dataclasses.fields(sk.HeadOptions)} and "temperature" not in opts
    hidden = torch.randn(5, head.weight.shape[1])
    targets = torch.randint(0, head.weight.shape[0], (5,))
    with torch.no_grad():
        got = sk.linear_logprobs(hidden, head.weight, targets, temperature=0.7, **opts)
        want = sk.linear_logprobs(hidden, head.weight, targets, bias=head.bias, temperature=0.7, logit_scale=0.5,
                                  softcap=3.0)  # fmt: skip
    assert torch.equal(got.logp, want.logp) and torch.equal(got.entropy, want.entropy)


TWO_PROCESS_SCRIPT = r"""
import sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from tests.test_integrations_trl import trainer
t = trainer(Path(sys.argv[2]), per_device_train_batch_size=4)
t.train()
flat = torch.cat([p.detach().reshape(-1) for p in t.model.parameters()])
parts = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
dist.all_gather(parts, flat)
assert all(torch.equal(parts[0], q) for q in parts), "the ranks' weights differ after training"
logs = [h for h in t.state.log_history if "loss" in h]
assert len(logs) == 2 and all("sgrpo/masked_frac" in h for h in logs), logs
if dist.get_rank() == 0:
    print("TWO-PROCESS OK", len(logs))
# the DDP-wrapped model goes before the process group (train.distributed.shutdown: a reducer that outlives the group
# can hang the process at exit)
import gc
del t
gc.collect()
dist.destroy_process_group()
"""


def _torchrun(tmp_path, script: str) -> str:
    """Run `script` on 2 gloo processes of this CPU (torchrun); its stdout."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    path = tmp_path / "job.py"
    path.write_text(script)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), str(path), str(repo), str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    res = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def test_two_processes_train_and_stay_in_sync(tmp_path):
    """torchrun, 2 gloo processes on this CPU: the groups are gathered across processes for the advantages and
    conflict weights, the ranks train 2 steps and end with identical weights."""
    assert "TWO-PROCESS OK 2" in _torchrun(tmp_path, TWO_PROCESS_SCRIPT)


class FixedCompletions(SGRPOTrainer):
    """Sampling replaced by a fixed function of (prompt, place in its group), so that jobs with different process
    counts or micro-batch splits see the same completions and rewards. The place is the row's index in the global
    generation batch mod G: TRL's RepeatSampler puts a prompt's G copies on consecutive rows of the global batch, and
    process r holds the r-th equal, contiguous slice of it. The completions of a group differ in their answer and digit
    count (the rewards, hence the advantages, vary), in length (padding differs per process) and share '.' tokens at
    the same positions across advantage signs (conflict weights != 1)."""

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        tok, first = self.processing_class, self.accelerator.process_index * len(prompt_ids)
        completions = []
        for i, ids in enumerate(prompt_ids):
            a, b = tok.decode(ids, skip_special_tokens=True).removesuffix(" =").split(" + ")
            s, k = int(a) + int(b), (first + i) % num_generations
            text = [f"{s}", f"{s + 1}.", f"{s}..", f"{(s + 1) % 10}{s % 10}.."][k % 4]
            completions.append(tok.encode(text, add_special_tokens=False) + ([tok.eos_token_id] if k != 2 else []))
        return completions, None  # (no sampling log-probs: TRL's transformers path has none either)

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.scored = [*getattr(self, "scored", []), out]
        return out


# name -> (preset, LossConfig overrides): whole-group conflict weights (gtpo 2 / 0, s_grpo 1 / 0) and the loss
# aggregations whose normalizer is not a per-completion mean: token-mean (dapo), seq-sum-token-mean (gtpo_official).
# The ln 2 / 0.7 entropy filters would drop every completion of this random model (entropy ~3.86 nats): no gradient
SAME_BATCH_RUNS = {
    "gtpo": ("gtpo", "entropy_filter=none"),
    "s_grpo": ("s_grpo", "entropy_filter=none"),
    "dapo": ("dapo", ""),
    "gtpo_official": ("gtpo_official", "entropy_filter=none"),
}


def same_batch_update(tmp_path, name: str, **kw) -> tuple[dict[str, torch.Tensor], FixedCompletions]:
    """The change of every weight after 2 optimizer steps on 12 rows (3 prompts x 4) per step. Plain SGD, constant
    lr, no gradient clipping, fp32: the update is lr times the gradient, so a gradient scaled wrongly shows (Adam's
    first step is ~lr * sign(g), and clipping to a norm would hide a scale)."""
    t = trainer(tmp_path, *SAME_BATCH_RUNS[name], cls=FixedCompletions, num_generations=4, optim="sgd",
                learning_rate=0.5, lr_scheduler_type="constant", max_grad_norm=0.0, bf16=False, **kw)  # fmt: skip
    before = trained_params(t)
    t.train()
    return {k: v - before[k] for k, v in trained_params(t).items()}, t


def assert_same_update(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    """Equal to 2e-6 of the largest update. Both runs compute the same fp32 sums in another order (two half-batch
    gradients all-reduced or accumulated instead of one, per-micro-batch padding, after 2 steps): measured <= 5e-7,
    a few fp32 ulps (1.2e-7). A wrong gathering or normalization moved it by 3e-2 to 1.2 times its size."""
    scale = max(v.abs().max().item() for v in want.values())
    assert scale > 1e-3, f"{what}: the reference run barely moved ({scale:.2e})"
    worst = max(((got[k] - want[k]).abs().max().item(), k) for k in want)
    assert worst[0] <= 2e-6 * scale, f"{what}: {worst[1]} differs by {worst[0]:.3e} (largest update {scale:.3e})"


def check_batch_is_not_trivial(t: FixedCompletions, name: str) -> None:
    for out in t.scored:
        assert (out["advantages"] != 0).sum() >= 6  # rewards vary within most groups
        if "sgrpo_token_weights" in out:  # conflicts within whole groups change some weights
            assert (out["sgrpo_token_weights"][out["completion_mask"].bool()] != 1).any(), name


SAME_BATCH_SCRIPT = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from tests.test_integrations_trl import SAME_BATCH_RUNS, same_batch_update
out = Path(sys.argv[2])
for name in SAME_BATCH_RUNS:
    update, t = same_batch_update(out / name, name, per_device_train_batch_size=6)
    if t.accelerator.is_main_process:
        torch.save(update, out / f"{name}.pt")
print("SAME-BATCH OK")
import gc, torch.distributed as dist
del t
gc.collect()  # the DDP-wrapped model goes before the process group (see TWO_PROCESS_SCRIPT)
dist.destroy_process_group()
"""


def test_two_processes_give_the_one_process_update(tmp_path):
    """Issue 13: 2 gloo processes with 6 rows each and 1 process with 12 rows see the same global batch (groups of 4,
    one of them split across the processes) and make the same 2 updates."""
    assert "SAME-BATCH OK" in _torchrun(tmp_path, SAME_BATCH_SCRIPT)
    for name in SAME_BATCH_RUNS:
        want, t = same_batch_update(tmp_path / "one" / name, name, per_device_train_batch_size=12)
        check_batch_is_not_trivial(t, name)
        assert_same_update(torch.load(tmp_path / f"{name}.pt"), want, f"{name}, 2 processes vs 1")


@pytest.mark.parametrize("name", list(SAME_BATCH_RUNS))
def test_gradient_accumulation_gives_the_one_micro_batch_update(tmp_path, name):
    """2 micro-batches of 6 rows (TRL shuffles the generation batch, then splits it) and one micro-batch of 12 rows
    make the same 2 updates."""
    want, _ = same_batch_update(tmp_path / "one", name, per_device_train_batch_size=12)
    got, _ = same_batch_update(tmp_path / "acc", name, per_device_train_batch_size=6, gradient_accumulation_steps=2)
    assert_same_update(got, want, f"{name}, 2 accumulated micro-batches vs 1")


@pytest.mark.parametrize(
    ("preset", "loss", "extra"),
    [
        ("grpo", "", {"beta": 0.04}),  # TRL's reference model and its log-probs feed the preset's KL term
        ("s_grpo", "entropy_filter=quantile:0.75", {"num_iterations": 2}),  # old log-probs from TRL
        ("gtpo", "entropy_filter=none", {"gradient_accumulation_steps": 2, "per_device_train_batch_size": 4}),
        # the sampler's support: policy, old and reference log-probs all over it
        ("grpo", "", {"beta": 0.04, "num_iterations": 2, "top_p": 0.8, "top_k": 20}),
    ],
)
def test_trl_features_work_through_the_integration(tmp_path, monkeypatch, preset, loss, extra):
    import sgrpo_kernels.integrations.trl as integration

    seen = []

    def spy(*args, **kwargs):
        seen.append({k: kwargs[k] is not None for k in ("old_logp", "ref_logp")})
        return rl.sgrpo_loss(*args, **kwargs)

    monkeypatch.setattr(integration, "sgrpo_loss", spy)
    t = trainer(tmp_path, preset, loss, from_disk=bool(extra.get("beta")), **extra)
    before = trained_params(t)
    t.train()
    after = trained_params(t)
    assert max((after[k] - before[k]).abs().max().item() for k in before) > 0
    logs = [h for h in t.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(np_finite(h["loss"]) for h in logs)
    assert seen and all(s["ref_logp"] == bool(extra.get("beta")) for s in seen)  # TRL's reference log-probs
    if extra.get("beta"):  # the k3 KL against them: 0 before the first update, > 0 after it
        assert logs[0]["kl"] == pytest.approx(0.0, abs=1e-6) and logs[-1]["kl"] > 0
    assert all(s["old_logp"] == bool(extra.get("num_iterations")) for s in seen)  # TRL's old log-probs when reused
    if extra.get("gradient_accumulation_steps"):
        assert len(seen) == 4  # 2 optimizer steps x 2 micro-batches


def np_finite(x: float) -> bool:
    import math

    return math.isfinite(x)


def test_trl_example_shows_progress_with_an_eta(monkeypatch):
    """examples/trl_sgrpo.py trains with TRL's progress bar (steps, ETA). Loading the bundled trainer's model sets
    transformers' verbosity to error, after which TrainingArguments' default turns the bar off (disable_tqdm): the
    example sets it on. The example is run up to building the trainer, on the tiny model."""
    import importlib.util
    import sys
    from pathlib import Path

    try:
        import sgrpo_train  # noqa: F401  (the bundled trainer installed under its package name)
    except ImportError:  # a checkout: the same package as `train`
        import train.model
        import train.rewards
        import train.tasks  # noqa: F401  (all three put in sys.modules)

        for name in ("", ".model", ".rewards", ".tasks"):
            monkeypatch.setitem(sys.modules, "sgrpo_train" + name, sys.modules["train" + name])
    file = Path(__file__).resolve().parents[1] / "examples" / "trl_sgrpo.py"
    spec = importlib.util.spec_from_file_location("trl_sgrpo_example", file)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    from transformers.utils import logging as hf_logging

    built = []

    class Built(Exception):
        pass

    def tiny_loader(name, device, dtype, seed=0, progress=None):
        from train.model import tiny_model_and_tokenizer

        hf_logging.set_verbosity_error()  # as the real loader does
        return tiny_model_and_tokenizer(seed)

    def capture(*args, **kwargs):
        built.append(kwargs["args"])
        raise Built

    monkeypatch.setattr(example, "load_model_and_tokenizer", tiny_loader)
    monkeypatch.setattr(example, "SGRPOTrainer", capture)
    monkeypatch.setattr(sys, "argv", ["trl_sgrpo.py", "--steps", "1", "--output-dir", "/tmp/unused"])
    verbosity = hf_logging.get_verbosity()
    try:
        with pytest.raises(Built):
            example.main()
    finally:
        hf_logging.set_verbosity(verbosity)
    assert built and built[0].disable_tqdm is False


# --------------------------------------------------- the trust region, the field's losses, sampler-mismatch correction


@pytest.mark.parametrize(("preset", "loss", "extra"), [("grpo", "beta=0", {}), (None, "", {"loss_type": "dapo"}),
                                                        ("cispo", "", {})])  # fmt: skip
def test_trust_region_caps_every_step_and_logs_it(tmp_path, preset, loss, extra):
    """SGRPOConfig(trust_region=delta), with a preset or TRL's own loss (sgrpo_preset=None): every optimizer step's
    norm is logged before and after the projection; after it, never above delta; the weights moved by that much."""
    cap = 1e-3
    t = trainer(tmp_path, preset, loss, trust_region=cap, max_steps=3, learning_rate=5e-2, **extra)
    moves = []
    t.add_callback(_StepMoves(moves, t))
    t.train()
    logs = [h for h in t.state.log_history if "trust_region/step_norm" in h]
    assert len(logs) == 3
    for h in logs:
        assert h["trust_region/step_norm"] > cap and h["trust_region/projected"] == 1.0  # lr 5e-2: far outside
        assert 0.99 * cap <= h["trust_region/step_norm_after"] <= cap
    assert t.trust_region.steps == 3 and len(moves) == 3
    assert all(0.99 * cap <= m <= cap * (1 + 1e-6) for m in moves), moves


class _StepMoves(TrainerCallback):
    """The float64 norm of each optimizer step's change of the trained weights, measured outside the trust region."""

    def __init__(self, out, t):
        self.out, self.t, self.before = out, t, None

    def on_step_begin(self, args, state, control, **kw):
        self.before = {n: p.detach().double().clone() for n, p in self.t.model.named_parameters() if p.requires_grad}

    def on_step_end(self, args, state, control, **kw):
        now = {n: p.detach().double() for n, p in self.t.model.named_parameters() if p.requires_grad}
        self.out.append(float(torch.sqrt(sum(((now[n] - self.before[n]) ** 2).sum() for n in now))))


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"trust_region": -0.1}, ["trust_region=-0.1", "> 0"]),
        ({"trust_region": float("nan")}, ["trust_region=nan", "> 0"]),
        ({"trust_region": 0.0}, ["trust_region=0.0", "> 0"]),
        ({"trust_region": "0.1"}, ["trust_region='0.1'", "number"]),
        ({"vllm_importance_sampling_mode": "geometric_mask"}, ["vllm_importance_sampling_mode='geometric_mask'",
                                                               "sequence_mask"]),  # fmt: skip
        ({"vllm_importance_sampling_clip_max": -1.0}, ["vllm_importance_sampling_clip_max", "> 0.0", "-1.0"]),
        ({"off_policy_mask_threshold": float("nan")}, ["off_policy_mask_threshold=nan", ">= 0"]),
        ({"off_policy_mask_threshold": -1.0}, ["off_policy_mask_threshold=-1.0", ">= 0"]),
        ({"sgrpo_preset": None, "sgrpo_loss": "beta=0"}, ["sgrpo_preset=None", "sgrpo_loss='beta=0'"]),
        ({"sgrpo_preset": "cispo", "sgrpo_loss": "sapo_tau_pos=2"}, ["sapo_tau_pos", "policy_term"]),
    ],
)
def test_new_fields_refuse_nonsense(tmp_path, overrides, words):
    from conftest import assert_refused

    kw = {"output_dir": str(tmp_path), "use_cpu": True, "report_to": [], "beta": 0.0}
    assert_refused(lambda: SGRPOConfig(**kw, **overrides), ValueError, words)


def _current_logps(t, inputs):
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        lp, _, _ = t._get_per_token_logps_and_entropies(t.model, ids, att, inputs["completion_ids"].size(1))
    return lp


def _both_losses(t, inputs, atol: float = 1e-6):
    """TRL's `_compute_loss` and SGRPOTrainer's on the same batch: equal losses and gradients (rtol 1e-5)."""
    losses, grads = [], []
    for compute in (trl.GRPOTrainer._compute_loss, SGRPOTrainer._compute_loss):
        t.model.zero_grad(set_to_none=True)
        loss = compute(t, t.model, dict(inputs))
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=atol)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for k in grads[0]:
        torch.testing.assert_close(grads[1][k], grads[0][k], rtol=1e-5, atol=atol, msg=k)
    assert max(g.abs().max().item() for g in grads[0].values()) > 1e-4  # a real gradient was compared
    return losses


@pytest.mark.parametrize(("preset", "loss", "trl_kw"), [
    ("cispo", "epsilon_low=1.0,epsilon_high=1.5", {"loss_type": "cispo", "epsilon_high": 2.5}),
    ("sapo", "", {"loss_type": "sapo"}),
    ("sapo", "sapo_tau_pos=2.0,sapo_tau_neg=3.0", {"loss_type": "sapo", "sapo_temperature_pos": 2.0,
                                                   "sapo_temperature_neg": 3.0}),
])  # fmt: skip
def test_parity_with_trl_cispo_and_sapo(tmp_path, preset, loss, trl_kw):
    """TRL 1.16's loss_type cispo (weight min(r, eps_max) = ours with epsilon_low=1, epsilon_high=eps_max - 1, token
    mean over the batch) and sapo (its temperatures, mean over sequences of the token mean) equal the presets, off
    policy (old log-probs 0.3 nats away), loss and gradients."""
    t = trainer(tmp_path, preset, loss, temperature=0.7, bf16=False, **trl_kw)
    t.model.train()
    t.current_gradient_accumulation_steps = 1
    inputs = _inputs(t)
    g = torch.Generator().manual_seed(1)
    lp = _current_logps(t, inputs)
    inputs["old_per_token_logps"] = lp + 0.3 * torch.randn(lp.shape, generator=g)
    _both_losses(t, inputs)


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_sampler_correction_from_trls_fields_equals_trl(tmp_path, mode, beta):
    """With vLLM's log-probs in the batch, the integration weights the loss by the RL layer's sampler IS weights from
    TRL's own fields; equal to TRL's loss given TRL's ratio (written here from TRL's rule), and to TRL's off-policy
    sequence mask. With a KL term (beta 0.04) the weights and the mask act on the policy term alone, as TRL's: they
    weighed the KL term too (0.2-0.6% off TRL's loss)."""
    kl = dict(from_disk=True, beta=beta, use_bias_correction_kl=False) if beta else {}
    t = trainer(tmp_path, "grpo", "" if beta else "beta=0", loss_type="grpo", epsilon=0.2, temperature=0.7,
                bf16=False, vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_max=1.3,
                vllm_importance_sampling_clip_min=0.8, off_policy_mask_threshold=0.05, **kl)  # fmt: skip
    t.model.train()
    t.current_gradient_accumulation_steps = 1
    t.use_vllm, t.vllm_importance_sampling_correction = True, True  # as if vLLM had sampled the batch
    inputs = _inputs(t)
    mask = inputs["completion_mask"].float()
    g = torch.Generator().manual_seed(2)
    lp = _current_logps(t, inputs)
    old = lp + 0.1 * torch.randn(lp.shape, generator=g)
    sampled = old + 0.15 * torch.randn(lp.shape, generator=g)
    diff = (old - sampled) * mask
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    ratio = ratio.clamp(0.8, 1.3) if mode.endswith("truncate") else ratio.masked_fill((ratio < 0.8) | (ratio > 1.3), 0)
    inputs.update(old_per_token_logps=old, sampling_per_token_logps=sampled, importance_sampling_ratio=ratio)
    if beta:
        inputs["ref_per_token_logps"] = lp + 0.2 * torch.randn(lp.shape, generator=g)
    _both_losses(t, inputs)
    kl = ((sampled - lp) * mask).sum(-1) / mask.sum(-1)
    assert ((inputs["advantages"] < 0) & (kl > 0.05)).any()  # the off-policy mask dropped a completion


# -------------------------------------------------------------- the sampler's support: TRL's top_k / top_p / min_p


def _args(tmp_path, **kw) -> SGRPOConfig:
    return SGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], beta=0.0, **kw)


@pytest.mark.parametrize(
    ("fields", "want"),
    [
        ({}, {}),  # TRL's defaults: top_k=0, top_p=1.0, min_p=None
        ({"top_k": 0, "top_p": 1.0, "min_p": 0.0}, {}),  # the off values spelled out
        ({"top_k": None, "top_p": None, "min_p": None}, {}),
        ({"top_k": -1, "top_p": 1}, {}),  # vLLM's top-k off; an int 1
        ({"top_k": 5}, {"top_k": 5}),
        ({"top_k": 7, "top_p": 0.9}, {"top_k": 7, "top_p": 0.9}),
        ({"top_k": 7, "min_p": 0.05}, {"top_k": 7, "min_p": 0.05}),
        ({"top_p": 0.9, "min_p": 0.05, "use_vllm": True}, {"top_p": 0.9, "min_p": 0.05}),  # vLLM's order is ours
        ({"top_p": 0.9, "generation_kwargs": {"top_p": 0.7, "top_k": 3}}, {"top_k": 3, "top_p": 0.7}),  # TRL's override
        ({"top_p": 0.9, "generation_kwargs": {"top_p": 1.0}}, {}),
        ({"temperature": 0.7, "generation_kwargs": {"temperature": 0.7}}, {}),  # the same temperature in both: fine
    ],
)
def test_trl_sampler_fields_map_to_the_ops_options(tmp_path, fields, want):
    from sgrpo_kernels.integrations.trl_support import sampler_support

    assert sampler_support(_args(tmp_path, **fields)) == want


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"top_p": 1.5}, ["top_p=1.5", "(0, 1]"]),
        ({"top_p": 0.0}, ["top_p=0.0", "(0, 1]"]),
        ({"top_p": float("nan")}, ["top_p=nan", "(0, 1]"]),
        ({"top_k": -2}, ["top_k=-2", "int >= 1"]),
        ({"top_k": 2.5}, ["top_k=2.5", "int >= 1"]),
        ({"min_p": 1.0}, ["min_p=1.0", "[0, 1)", "top_k=1"]),
        ({"min_p": -0.1}, ["min_p=-0.1", "[0, 1)"]),
        ({"generation_kwargs": {"top_p": 2}}, ["generation_kwargs={'top_p': 2}", "(0, 1]"]),
        # TRL samples at generation_kwargs' temperature and computes its log-probs at `temperature`: scored off-sample
        ({"temperature": 1.0, "generation_kwargs": {"temperature": 0.7}},
         ["generation_kwargs={'temperature': 0.7}", "temperature=1.0", "set temperature=0.7"]),
        # transformers' generate applies min_p after top_p: another support than vLLM's, which the ops follow
        ({"top_p": 0.9, "min_p": 0.05}, ["top_p=0.9", "min_p=0.05", "use_vllm=False", "use_vllm=True"]),
    ],
)
def test_trl_sampler_fields_refuse_what_cannot_work(tmp_path, fields, words):
    from conftest import assert_refused

    assert_refused(lambda: _args(tmp_path, **fields), ValueError, words)


def test_a_backend_that_does_not_apply_the_support_is_refused_at_the_start(tmp_path, monkeypatch):
    from conftest import assert_refused

    import sgrpo_kernels.integrations.trl_support as trl_support

    monkeypatch.setattr(trl_support, "applies_threshold", lambda name: False)
    assert_refused(lambda: trainer(tmp_path, top_p=0.9), ValueError, ["top_p=0.9", "'torch' backend", "top_p=1.0"])
    trainer(tmp_path)  # without the support, no backend is asked for it


def _reference_logps(m, ids, att, t_len: int, temperature: float, **support):
    """float64 log-probs and entropies of the last t_len tokens from the model's full logits, truncated by
    sgrpo_kernels.reference (the specification); 0 where the attention mask is 0."""
    with torch.no_grad():
        logits = m(input_ids=ids, attention_mask=att).logits[:, -t_len - 1 : -1].double()
    targets = ids[:, -t_len:].masked_fill(att[:, -t_len:] == 0, -100)
    return reference.logprobs_from_logits(logits, targets, temperature=temperature, out_dtype=None, **support)


def _assert_over_support(lp, m, ids, att, t_len, temperature, support, entropy=None):
    """lp (and entropy) equal the reference over `support`, and each setting of it changes the numbers."""
    want_lp, want_h = _reference_logps(m, ids, att, t_len, temperature, **support)
    torch.testing.assert_close(lp.double(), want_lp, rtol=1e-5, atol=2e-5)
    if entropy is not None:
        torch.testing.assert_close(entropy.double(), want_h, rtol=1e-5, atol=2e-5)
    for name in support:  # without this setting the numbers move: the comparison above sees it
        other, _ = _reference_logps(m, ids, att, t_len, temperature, **{k: v for k, v in support.items() if k != name})
        assert (other - want_lp).abs().max() > 1e-2, name


@pytest.mark.parametrize("support", [{"top_p": 0.8}, {"top_k": 3, "min_p": 0.5}])
def test_trl_log_prob_method_is_over_the_support(tmp_path, support):
    """SGRPOTrainer._get_per_token_logps_and_entropies (TRL's old and reference log-probs, and its own loss's) gives
    the log-probs and entropies of the truncated distribution at TRL's temperature, chunked as TRL asks."""
    t = trainer(tmp_path, temperature=0.7, bf16=False, **support)
    inputs = _inputs(t)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    c = inputs["completion_ids"].size(1)
    with torch.no_grad():
        lp, ent, aux = t._get_per_token_logps_and_entropies(t.model, ids, att, c, batch_size=3, compute_entropy=True)
    assert aux is None and lp.shape == ent.shape == (8, c)
    _assert_over_support(lp, t.model, ids, att, c, 0.7, support, entropy=ent)


def test_trls_old_and_reference_log_probs_are_over_the_support(tmp_path):
    """A real generation step (transformers' generate with top_p, beta > 0, num_iterations 2): TRL's
    old_per_token_logps (policy) and ref_per_token_logps (reference model) are those of the truncated distribution,
    and every sampled token lies in the support the ops compute."""
    t = trainer(tmp_path, "grpo", "", from_disk=True, beta=0.04, num_iterations=2, top_p=0.8, temperature=0.7,
                bf16=False)  # fmt: skip
    t.model.train()
    with torch.no_grad():  # the policy moves away from the reference: the two comparisons differ
        for p in t.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    out = t._generate_and_score_completions(next(iter(t.get_train_dataloader())))
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
    att = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
    c, mask = out["completion_ids"].size(1), out["completion_mask"].bool()
    support = {"top_p": 0.8}
    _assert_over_support(out["old_per_token_logps"], t.model, ids, att, c, 0.7, support)
    _assert_over_support(out["ref_per_token_logps"], t.ref_model, ids, att, c, 0.7, support)
    assert (out["old_per_token_logps"] - out["ref_per_token_logps"])[mask].abs().max() > 1e-2
    with torch.no_grad():
        z = t.model(input_ids=ids, attention_mask=att).logits[:, -c - 1 : -1].double() / 0.7
    flat = z.reshape(-1, z.shape[-1])
    keep = reference.sampler_support(flat, flat.argmax(-1), top_p=0.8)  # (the argmax is always kept)
    sampled = keep.gather(1, out["completion_ids"].reshape(-1, 1)).view(mask.shape)
    assert sampled[mask].all() and not keep.all()  # transformers' top_p sampled inside the ops' support


@pytest.mark.parametrize("off", [{}, {"top_k": 0, "top_p": 1.0, "min_p": 0.0}, {"top_k": None, "min_p": None}])
def test_trl_sampler_defaults_call_everything_as_before(tmp_path, monkeypatch, off):
    """With the sampler settings off, the loss is called without top_k / top_p / min_p and TRL's log-probs are TRL's
    own computation: the same numbers, bit for bit."""
    import sgrpo_kernels.integrations.trl as integration

    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return rl.sgrpo_loss(*args, **kwargs)

    monkeypatch.setattr(integration, "sgrpo_loss", spy)
    t = trainer(tmp_path, "grpo", "beta=0", temperature=0.7, bf16=False, **off)
    t.model.train()
    t.current_gradient_accumulation_steps = 1
    inputs = _inputs(t)
    SGRPOTrainer._compute_loss(t, t.model, dict(inputs))
    assert seen and not {"top_k", "top_p", "min_p"} & set(seen[-1])  # the call of before this feature
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        got = t._get_per_token_logps_and_entropies(t.model, ids, att, 6, compute_entropy=True)
        want = trl.GRPOTrainer._get_per_token_logps_and_entropies(t, t.model, ids, att, 6, compute_entropy=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_the_loss_is_over_the_support_and_equals_trls_own(tmp_path, monkeypatch):
    """top_p=0.8 reaches the fused loss (its log-probs are over the support), and the loss and gradients equal TRL's
    own loss_type='grpo', whose policy log-probs come from the overridden TRL method over the same support; both
    differ from the full-softmax loss."""
    import sgrpo_kernels.integrations.trl as integration

    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return rl.sgrpo_loss(*args, **kwargs)

    monkeypatch.setattr(integration, "sgrpo_loss", spy)
    kw = dict(loss_type="grpo", epsilon=0.2, temperature=0.7, bf16=False)
    t = trainer(tmp_path, "grpo", "beta=0", top_p=0.8, **kw)
    t.model.train()
    t.current_gradient_accumulation_steps = 1
    inputs = _inputs(t)
    g = torch.Generator().manual_seed(1)
    lp = _current_logps(t, inputs)  # over the support: an off-policy batch whose ratios are not all 1
    inputs["old_per_token_logps"] = lp + 0.3 * torch.randn(lp.shape, generator=g)
    losses = _both_losses(t, inputs)
    assert seen[-1]["top_p"] == 0.8 and not {"top_k", "min_p"} & set(seen[-1])
    full = trainer(tmp_path, "grpo", "beta=0", **kw)
    full.model.train()
    full.current_gradient_accumulation_steps = 1
    assert (SGRPOTrainer._compute_loss(full, full.model, dict(inputs)) - losses[1]).abs() > 1e-3


@pytest.mark.parametrize("text", ["None", "none"])
def test_trls_own_loss_from_the_command_line(tmp_path, text):
    """`--sgrpo_preset None` reached the preset lookup as the text 'None' ("unknown preset 'None'"): TRL's own loss
    could not be chosen from flags, only from a YAML null."""
    from transformers import HfArgumentParser

    (args,) = HfArgumentParser(SGRPOConfig).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--use_cpu", "--report_to", "none", "--beta", "0.0", "--sgrpo_preset", text]
    )
    assert args.sgrpo_preset is None
