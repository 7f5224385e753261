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
