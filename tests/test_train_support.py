"""The sampler's support in the bundled trainer (issue 42): `--top-k`, `--top-p`, `--min-p` reach the rollout engine
and every log-prob the loss uses (the policy's, the old policy's, the reference's), so that the loss scores the
distribution the sampler drew from; a run without them calls the ops exactly as before."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("transformers")

import conftest  # noqa: E402

from train.batch import Sampling  # noqa: E402
from train.config import ConfigError, TrainConfig  # noqa: E402


def _sampling(**kw) -> Sampling:
    return Sampling(group_size=2, max_new_tokens=4, temperature=0.7, top_p=kw.pop("top_p", 1.0), system_prompt=None,
                    format_weight=0.0, **kw)  # fmt: skip


def test_support_names_only_what_truncates():
    assert _sampling().support() == {}
    assert _sampling(top_p=0.9).support() == {"top_p": 0.9}
    assert _sampling(top_k=5, min_p=0.05).support() == {"top_k": 5, "min_p": 0.05}


@pytest.mark.parametrize(
    "fields, words",
    [({"top_k": -1}, ["top_k", "-1"]), ({"min_p": 1.0}, ["min_p", "1.0"]), ({"min_p": math.nan}, ["min_p", "nan"]),
     ({"min_p": -0.1}, ["min_p", "-0.1"])],
)  # fmt: skip
def test_refusals(fields, words, tmp_path):
    conftest.assert_refused(lambda: TrainConfig(output_dir=str(tmp_path), **fields), ConfigError, words)


def _spy(monkeypatch):
    """Records the keyword arguments of every sgrpo_loss, token_logprobs and HF generate call of a run."""
    import train.engines.hf as hf
    import train.loss as loss
    import train.policy as policy

    seen = {"loss": [], "logprobs": [], "generate": []}
    real_loss, real_lp, real_gen = loss.sgrpo_loss, policy.linear_logprobs, hf.hf_generate

    def spy_loss(*a, **k):
        seen["loss"].append(k)
        return real_loss(*a, **k)

    def spy_lp(*a, **k):
        seen["logprobs"].append(k)
        return real_lp(*a, **k)

    def spy_gen(*a, **k):
        seen["generate"].append((a, k))
        return real_gen(*a, **k)

    monkeypatch.setattr(loss, "sgrpo_loss", spy_loss)
    monkeypatch.setattr(policy, "linear_logprobs", spy_lp)
    monkeypatch.setattr(hf, "hf_generate", spy_gen)
    return seen


SUPPORT = ("top_k", "top_p", "min_p")


def test_the_support_reaches_the_sampler_and_every_logprob(tmp_path, monkeypatch):
    import train.loop as loop

    seen = _spy(monkeypatch)
    # grpo: the reference's log-probs; 2 PPO epochs: the old policy's; the log-probs of every loss pass
    cfg = conftest.tiny_cfg(tmp_path / "run", max_steps=1, preset="grpo", ppo_epochs=2, top_k=5, top_p=0.9)
    loop.train(cfg)
    assert seen["loss"] and all({k: c.get(k) for k in SUPPORT} == {"top_k": 5, "top_p": 0.9, "min_p": None}
                                for c in seen["loss"])  # fmt: skip
    # the reference and the PPO epochs' old log-probs (the KL-from-init probe measures the whole distribution)
    scored = [c for c in seen["logprobs"] if c.get("top_k") == 5]
    assert len(scored) >= 2 and all(c["top_p"] == 0.9 for c in scored)
    sampled = [k for a, k in seen["generate"] if not (a[7] if len(a) > 7 else k.get("greedy", False))]
    assert sampled and all(k["top_k"] == 5 and k["min_p"] == 0.0 for k in sampled)


def test_without_support_the_ops_are_called_as_before(tmp_path, monkeypatch):
    import train.loop as loop

    seen = _spy(monkeypatch)
    loop.train(conftest.tiny_cfg(tmp_path / "run", max_steps=1, preset="grpo", ppo_epochs=2))
    assert seen["loss"] and not any(k in c for c in seen["loss"] + seen["logprobs"] for k in SUPPORT)


def test_min_p_with_top_p_under_hf_generate_is_refused(tmp_path, capsys):
    from train.__main__ import main

    code = main(conftest.tiny_argv(str(tmp_path / "run"), "--max-steps", "1", "--min-p", "0.1", "--top-p", "0.9"))
    assert code == 2
    err = capsys.readouterr().err
    assert "--min-p 0.1" in err and "--top-p 0.9" in err and "HF generate" in err and "vLLM" in err
