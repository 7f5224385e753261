"""Defects an adversarial review of the TRL integration found (2026-11-30), each a test that failed before its fix:
head settings of some model families read wrongly, TRL fields accepted under a preset and silently ignored, the MoE
router loss dropped, a model whose hidden states are not [B, T, D] failing deep in the op, and TRL's logs showing
advantages the loss never used. Tiny random models built in-process; skipped without the `trl` extra."""

from __future__ import annotations

import pytest
import torch

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")

from sgrpo_kernels import linear_logprobs  # noqa: E402
from sgrpo_kernels.integrations.hf import lm_head  # noqa: E402

SMALL = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=2, max_position_embeddings=32)  # fmt: skip


def _class(name: str):
    cls = getattr(transformers, name, None)
    if cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {name}")
    return cls


def _hyperclovax():
    return _class("HyperCLOVAXForCausalLM")(_class("HyperCLOVAXConfig")(**SMALL, logits_scaling=4.0))


def _falcon_h1():
    cfg = _class("FalconH1Config")(**SMALL, lm_head_multiplier=4.0, mamba_d_ssm=16, mamba_n_heads=2, mamba_d_head=8,
                                   mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=4)  # fmt: skip
    return _class("FalconH1ForCausalLM")(cfg)


def _gemma4_multimodal():
    text = dict(vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, head_dim=8, max_position_embeddings=64, final_logit_softcapping=0.5,
                vocab_size_per_layer_input=300, hidden_size_per_layer_input=4, layer_types=["full_attention"])
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=8)  # fmt: skip
    cfg = _class("Gemma4Config")(text_config=text, vision_config=vision, audio_config=None, boi_token_id=290,
                                 eoi_token_id=291, image_token_id=292, video_token_id=293, boa_token_id=294,
                                 eoa_token_index=295, audio_token_id=296)  # fmt: skip
    model = _class("Gemma4ForConditionalGeneration")(cfg)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(30)  # logits large enough for the softcap to matter
    return model


@pytest.mark.parametrize("make", [_hyperclovax, _falcon_h1, _gemma4_multimodal],
                         ids=["hyperclovax_multiplies_by_logits_scaling", "falcon_h1_lm_head_multiplier",
                              "gemma4_softcap_in_text_config"])  # fmt: skip
def test_lm_head_gives_the_models_own_log_probs(make):
    """HyperCLOVA X's logits_scaling was applied as a divisor, Falcon-H1's lm_head_multiplier and a multimodal model's
    text_config softcap were ignored: log-probs off by 10 to 100 nats, with nothing said."""
    torch.manual_seed(0)
    model = make().eval()
    ids = torch.randint(0, 280 if make is _gemma4_multimodal else 64, (2, 6))
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
        want = torch.log_softmax(out.logits[:, :-1].double(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        head = lm_head(model)
        h = out.hidden_states[-1][:, :-1]
        got = linear_logprobs(h.reshape(-1, h.size(-1)), head.weight, ids[:, 1:].reshape(-1), **head.options()).logp
    torch.testing.assert_close(got.view(2, 5).double(), want, atol=1e-4, rtol=0)


def _trainer(tmp_path, model, **kw):
    from test_integrations_trl import dataset, reward, tokenizer

    from sgrpo_kernels.integrations.trl import SGRPOConfig, SGRPOTrainer

    args = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                max_completion_length=6, report_to=[], use_cpu=True, beta=0.0, sgrpo_preset="grpo",
                sgrpo_loss="beta=0", loss_type="grpo", epsilon=0.2, bf16=False, seed=0) | kw  # fmt: skip
    t = SGRPOTrainer(model=model, processing_class=tokenizer(), reward_funcs=reward, args=SGRPOConfig(**args),
                     train_dataset=dataset())  # fmt: skip
    t.model.train()
    t.current_gradient_accumulation_steps = 2
    return t


def test_the_moe_router_loss_is_added_as_trl_adds_it(tmp_path):
    """TRL adds router_aux_loss_coef x the load-balancing loss (over the accumulation steps) for an MoE; the preset's
    loss dropped it (TRL 1.0101 against 0.0083 on this model, the gap exactly 0.5 x the router loss)."""
    from test_integrations_trl import CHARS, _inputs

    torch.manual_seed(0)
    cfg = _class("Qwen3MoeConfig")(vocab_size=len(CHARS) + 4, hidden_size=32, intermediate_size=64,
                                   moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
                                   max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                   router_aux_loss_coef=0.5)  # fmt: skip
    t = _trainer(tmp_path, _class("Qwen3MoeForCausalLM")(cfg))
    assert t.aux_loss_enabled
    inputs = _inputs(t)
    want = trl.GRPOTrainer._compute_loss(t, t.model, dict(inputs))
    got = type(t)._compute_loss(t, t.model, dict(inputs))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert len(t._metrics["train"]["aux_loss"]) == 2  # logged by both, as TRL logs it


def test_a_model_whose_last_hidden_state_is_not_batch_by_length_is_refused_by_name(tmp_path):
    """Gemma 3n's last hidden state is its AltUp stack (4, B, L, D): the slice cut the batch axis and the op refused
    with 'hidden must be 3-D ... got (4, 6, 11, 32)', saying nothing of the model."""
    from test_integrations_trl import CHARS, _inputs

    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model("gemma3n_text")
    v = len(CHARS) + 4
    for k, val in dict(vocab_size=v, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, head_dim=8, vocab_size_per_layer_input=v,
                       hidden_size_per_layer_input=4, laurel_rank=4, layer_types=["full_attention"] * 2,
                       activation_sparsity_pattern=[0.0, 0.0], intermediate_size=[64, 64], num_kv_shared_layers=0,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0).items():  # fmt: skip
        setattr(cfg, k, val)
    t = _trainer(tmp_path, transformers.AutoModelForCausalLM.from_config(cfg))
    with pytest.raises(NotImplementedError, match=r"Gemma3nForCausalLM's last hidden state has shape \(4, 8, 11, 32\)"):
        type(t)._compute_loss(t, t.model, _inputs(t))


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("entropy_coef", 0.5, ["entropy_coef=0.5", "sgrpo_loss='entropy_coef=...'"]),
        ("use_adaptive_entropy", True, ["use_adaptive_entropy=True"]),
        ("delta", 1.05, ["delta=1.05", "no two-sided (delta) clip"]),
        ("importance_sampling_level", "sequence", ["importance_sampling_level='sequence'", "importance_level="]),
        ("multi_objective_aggregation", "normalize_then_sum", ["normalize_then_sum", "weighted sum"]),
    ],
)
def test_trl_loss_fields_a_preset_would_ignore_are_refused_by_name(field, value, words, tmp_path):
    """Each was accepted under a preset and changed nothing (TRL's loss with entropy_coef=0.5: -1.875; the preset's:
    +0.0499, as without it)."""
    from conftest import assert_refused

    from sgrpo_kernels.integrations.trl import SGRPOConfig

    kw = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, use_cpu=True, report_to=[],
              sgrpo_preset="grpo", sgrpo_loss="beta=0", beta=0.0)  # fmt: skip
    assert SGRPOConfig(**kw).sgrpo_preset == "grpo"  # TRL's defaults pass
    assert_refused(lambda: SGRPOConfig(**kw, **{field: value}), ValueError, [*words, "preset 'grpo'"])
    assert SGRPOConfig(**{**kw, "sgrpo_preset": None, "sgrpo_loss": ""}, **{field: value}).sgrpo_preset is None


def test_the_completions_log_shows_the_advantages_the_loss_uses(tmp_path):
    """TRL's completions table (log_completions, dashboards) showed TRL's own advantages ([-0.865, 0.865, ...]) where
    the dr_grpo preset trained on others ([-0.05, 0.05, ...])."""
    from test_integrations_trl import trainer

    t = trainer(tmp_path, "dr_grpo", "", temperature=1.0)
    t.model.train()
    torch.manual_seed(0)
    out = t._generate_and_score_completions(next(iter(t.get_train_dataloader())))
    logged = list(t._logs["advantages"])
    assert logged == pytest.approx(out["advantages"].tolist())
    assert len(logged) == out["advantages"].numel()


def test_a_zero3_partitioned_head_is_refused_by_name():
    """Under DeepSpeed ZeRO-3 a parameter outside its module's forward is an empty tensor (with ds_* attributes): the
    op then refused a (V=0) weight naming nothing of the cause. (DeepSpeed is not installed here: its parameter is
    imitated.)"""
    from test_integrations_trl import model

    m = model(tied=False)
    empty = torch.nn.Parameter(torch.empty(0))
    empty.ds_id, empty.ds_shape = 7, m.lm_head.weight.shape
    m.lm_head.weight = empty
    with pytest.raises(NotImplementedError, match="partitioned by DeepSpeed ZeRO-3"):
        lm_head(m)
