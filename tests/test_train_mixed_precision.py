"""`--mixed-precision bf16`: the decoder's forwards under torch.autocast(bfloat16), everything else in the weights'
dtype. Checked on the tiny model: the hidden states come back in fp32 and differ from fp32's only by bf16 round-off
(the LM head then takes them in fp32, outside the context); gradients reach the trained weights in fp32;
outside the context nothing changes; a run with it is deterministic and differs from one without (it does act);
`off` leaves every record as before (the fingerprint cases, benchmarks/fingerprint.py)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import tiny_argv  # noqa: E402

from train.__main__ import main  # noqa: E402
from train.model import mixed_precision, tiny_model_and_tokenizer  # noqa: E402
from train.policy import policy_hidden  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model, tok = tiny_model_and_tokenizer(0)
    ids = torch.randint(4, 60, (3, 9))
    return model, tok, ids, torch.ones_like(ids)


def test_hidden_states_are_fp32_with_bf16_round_off_only_inside_the_context(tiny):
    model, _, ids, mask = tiny
    ref = policy_hidden(model, ids, mask)
    with mixed_precision("bf16"):
        mixed = policy_hidden(model, ids, mask)
    with mixed_precision("off"):
        off = policy_hidden(model, ids, mask)
    assert mixed.dtype == torch.float32 and torch.equal(off, ref) and torch.equal(policy_hidden(model, ids, mask), ref)
    err = ((mixed - ref).abs().max() / ref.abs().max()).item()
    assert 0 < err < 0.05, err  # bf16 matmuls: a relative error of ~1e-2, never zero


def test_gradients_reach_the_trained_weights_in_fp32(tiny):
    model, _, ids, mask = tiny
    model.zero_grad()
    with mixed_precision("bf16"):
        loss = policy_hidden(model, ids, mask).square().mean()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    model.zero_grad()


def _steps(out) -> list[dict]:
    timing = ("step_s", "gen_s", "sync_s", "tokens_per_s", "peak_mem_mb")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith(timing)} for r in records if "event" not in r]


def test_a_run_with_it_is_deterministic_and_differs_from_one_without(tmp_path, capsys):
    flags = ("--max-steps", "2", "--kl-every", "1")
    runs = {}
    for name, extra in (("a", ("--mixed-precision", "bf16")), ("b", ("--mixed-precision", "bf16")), ("off", ())):
        assert main(tiny_argv(str(tmp_path / name), *flags, *extra)) == 0
        runs[name] = _steps(tmp_path / name)
    assert "mixed precision: the decoder's forwards under bf16 autocast (" in capsys.readouterr().out
    assert runs["a"] == runs["b"] and len(runs["a"]) == 2
    assert runs["a"] != runs["off"]
    assert json.loads((tmp_path / "a" / "config.json").read_text())["train"]["mixed_precision"] == "bf16"
    # HF generate's autocast decode is not the loss's forward: its log-probs come back, the mismatch is logged
    assert all(r["rollout_logp_diff"] is not None and r["rollout_logp_diff"] >= 0 for r in runs["a"])
    assert all(r["rollout_logp_diff"] is None for r in runs["off"])


def test_resume_refuses_to_switch_it(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(tiny_argv(out, "--max-steps", "1", "--kl-every", "0")) == 0
    assert main(tiny_argv(out, "--max-steps", "2", "--kl-every", "0", "--resume", "--mixed-precision", "bf16")) == 2
    assert "--mixed-precision: checkpoint 'off', now 'bf16'" in capsys.readouterr().err


def test_a_device_it_was_not_built_for_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    import train.setup as setup_module
    from train.errors import Refused

    monkeypatch.setattr(setup_module, "resolve_device", lambda name: torch.device("meta"))
    monkeypatch.setattr(setup_module, "load_policy", lambda *a: pytest.fail("the model was loaded"))
    cfg = setup_module.TrainConfig(model="tiny", mixed_precision="bf16", output_dir=str(tmp_path / "run"))
    with pytest.raises(Refused, match="--mixed-precision bf16: built and tested on CPU and CUDA, not meta"):
        setup_module.setup(cfg, cfg.loss_config())


def test_hf_generates_sampler_logprobs_equal_the_trainers_on_the_same_forward(tiny):
    """`sampled_logprobs` (generate's processed scores) against the trainer's log-probs of the sampler's support
    (temperature, top-k, top-p), with fp32 on both sides: equal to round-off; 0 after each completion's EOS."""
    from train.engines.hf import eos_ids, hf_generate
    from train.policy import token_logprobs
    from train.rollout import Batch, completion_mask

    model, tok, _, _ = tiny
    prompts = ["12 + 7 =", "3 + 4 =", "99 - 1 ="]
    got: list = []
    torch.manual_seed(1)
    p_ids, p_mask, c_ids = hf_generate(model, tok, prompts, 2, 6, 0.7, 0.9, top_k=20, logprobs=got)
    mask = completion_mask(c_ids, eos_ids(tok, model))
    batch = Batch(p_ids, p_mask, c_ids, mask, [""] * 6, torch.zeros(6), torch.zeros(6, dtype=torch.bool))
    want = token_logprobs(model, batch, 0.7, "torch", 2, False, {"top_k": 20, "top_p": 0.9})
    assert got[0].shape == c_ids.shape and (got[0] - want).abs()[mask].max().item() < 1e-5
    assert (got[0][~mask] == 0).all() and (got[0][mask] < 0).all()


def test_under_mixed_precision_hf_returns_sampler_logprobs_except_greedy(tiny):
    from train.engines.hf import HFEngine

    model, tok, _, _ = tiny
    engine = HFEngine(model, tok)
    assert engine.generate(["1 + 1 ="], 2, 4, 1.0, 1.0).logprobs is None  # off: the trainer's forward is the sampler
    with mixed_precision("bf16"):
        out = engine.generate(["1 + 1 ="], 2, 4, 1.0, 1.0)
        assert out.logprobs is not None and out.logprobs.shape == out.completion_ids.shape
        assert engine.generate(["1 + 1 ="], 1, 4, 1.0, 1.0, greedy=True).logprobs is None


def test_with_bf16_weights_it_does_nothing(tiny, tmp_path, capsys, monkeypatch):
    """Weights already bf16: no autocast at all (it would only move some ops up to fp32), and `--dtype auto` that
    resolves to bf16 (a GPU's) says so instead of claiming autocast."""
    import copy

    import train.setup as setup_module
    from train.model import autocasting

    model, _, ids, mask = tiny
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    with mixed_precision("bf16"):
        assert not autocasting(bf16) and autocasting(model)
        inside = policy_hidden(bf16, ids, mask)
    assert torch.equal(inside, policy_hidden(bf16, ids, mask))
    monkeypatch.setattr(setup_module, "resolve_dtype", lambda name, device: torch.bfloat16)
    monkeypatch.setattr(setup_module, "load_policy", lambda *a: pytest.fail("stop here"))
    cfg = setup_module.TrainConfig(model="tiny", mixed_precision="bf16", output_dir=str(tmp_path / "run"))
    with pytest.raises(pytest.fail.Exception):
        setup_module.setup(cfg, cfg.loss_config())
    out = capsys.readouterr().out
    assert "warning: --mixed-precision bf16 does nothing with --dtype auto on cpu: the weights are bf16" in out
    assert "under bf16 autocast" not in out


def test_grad_penalty_is_refused_with_it(tmp_path, capsys):
    """Its finite-difference step (radius 0.01 spread over the weights) is lost in the autocast forward's bf16
    weights, as with bf16 weights (refused the same way)."""
    argv = tiny_argv(str(tmp_path / "run"), "--max-steps", "1", "--grad-penalty", "0.1", "--mixed-precision", "bf16")
    assert main(argv) == 2
    assert "--grad-penalty with --mixed-precision bf16: its finite-difference step" in capsys.readouterr().err
