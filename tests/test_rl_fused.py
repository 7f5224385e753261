"""sgrpo_loss: loss and gradients (hidden, weight, bias) equal the same loss computed through the reference path."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import assert_refused

import sgrpo_kernels
from sgrpo_kernels import reference, rl
from sgrpo_kernels.rl import sgrpo_loss

B, T, D, V, G = 4, 5, 16, 37, 2


def make(seed: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, D, generator=gen, dtype=dtype)
    weight = torch.randn(V, D, generator=gen, dtype=dtype) * 0.3
    bias = torch.randn(V, generator=gen, dtype=dtype) * 0.1
    targets = torch.randint(0, V, (B, T), generator=gen)
    targets[:, :2] = 3  # shared prefix -> conflicts
    lengths = torch.tensor([T, 3, 4, 0])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    targets = torch.where(mask, targets, torch.full_like(targets, -100))
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv = rl.group_advantages(rewards, G)
    with torch.no_grad():
        old, _ = reference.linear_logprobs(hidden + 0.05, weight, targets, bias=bias, return_entropy=False)
        ref, _ = reference.linear_logprobs(hidden - 0.05, weight, targets, bias=bias, return_entropy=False)
    return hidden, weight, bias, targets, mask, rewards, adv, old, ref


CONFIGS = [
    rl.preset("grpo"),
    # random weights give token entropies near ln V > ln 2: filter by quantile, floor above the entropy so it bites
    dataclasses.replace(rl.preset("s_grpo"), entropy_filter="quantile:0.7", entropy_floor=4.0),
    dataclasses.replace(rl.preset("gtpo"), entropy_filter=None),  # keep every completion so the comparison bites
    rl.preset("gspo"),
    dataclasses.replace(rl.preset("dapo"), entropy_coef=0.01, entropy_ceiling=0.5, entropy_penalty_coef=0.3),
]


def run_path(fn, cfg, hidden, weight, bias, targets, mask, adv, old, ref, tw, counts, temperature):
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    b = bias.clone().requires_grad_(True)
    loss, metrics = fn(h, w, b, cfg, tw, counts, temperature)
    loss.backward()
    return loss.detach(), metrics, h.grad, w.grad, b.grad


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.name for c in CONFIGS])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_reference_path(cfg, temperature):
    hidden, weight, bias, targets, mask, rewards, adv, old, ref = make(0)
    ids = torch.where(mask, targets, torch.zeros_like(targets))
    tw, counts = cfg.conflict_weights(ids, mask, adv, G)

    def inputs(tw, counts) -> dict:  # the same loss inputs on both paths
        return {"old_logp": old, "ref_logp": ref, "token_weights": tw, "conflict_counts": counts, "rewards": rewards}

    def fused(h, w, b, cfg, tw, counts, temperature):
        return sgrpo_loss(h, w, targets, adv, mask, cfg, bias=b, temperature=temperature, **inputs(tw, counts),
                          group_size=G, compute_entropy=True)  # fmt: skip

    def naive(h, w, b, cfg, tw, counts, temperature):
        logp, ent = reference.linear_logprobs(h, w, targets, bias=b, temperature=temperature)
        return rl.policy_loss(logp, adv, mask, cfg, entropy=ent, **inputs(tw, counts), group_size=G, vocab_size=V)

    lf, mf, *gf = run_path(fused, cfg, hidden, weight, bias, targets, mask, adv, old, ref, tw, counts, temperature)
    ln, mn, *gn = run_path(naive, cfg, hidden, weight, bias, targets, mask, adv, old, ref, tw, counts, temperature)
    torch.testing.assert_close(lf, ln, rtol=1e-5, atol=1e-6)
    for name, a, b in zip(("hidden", "weight", "bias"), gf, gn):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)
    assert any((g != 0).any() for g in gf)
    assert float(mf["entropy_mean"]) == pytest.approx(float(mn["entropy_mean"]), rel=1e-5)  # floats: pytest >= 9.2
    # masked rows get exactly zero gradient in hidden
    assert (gf[0][~mask] == 0).all()


def test_matches_float64_reference_path():
    hidden, weight, bias, targets, mask, _, adv, _, _ = make(1, torch.float64)
    cfg = dataclasses.replace(rl.preset("s_grpo"), entropy_filter="quantile:0.7", entropy_floor=4.0)
    tw, counts = cfg.conflict_weights(torch.where(mask, targets, 0), mask, adv, G)
    h = hidden.clone().requires_grad_(True)
    loss, _ = sgrpo_loss(h, weight, targets, adv, mask, cfg, bias=bias, token_weights=tw, conflict_counts=counts)
    loss.backward()
    h2 = hidden.clone().requires_grad_(True)
    logp, ent = reference.linear_logprobs(h2, weight, targets, bias=bias, out_dtype=torch.float64)
    want, _ = rl.policy_loss(logp, adv, mask, cfg, entropy=ent, token_weights=tw, conflict_counts=counts)
    want.backward()
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h.grad, h2.grad, rtol=1e-4, atol=1e-6)
    assert (h.grad != 0).any() and float(loss) != 0.0


def test_zero_weight_and_filtered_rows_get_zero_hidden_grad():
    hidden, weight, bias, targets, mask, _, adv, _, _ = make(2)
    tw = torch.ones(B, T)
    tw[0, 1] = 0.0
    cfg = dataclasses.replace(rl.preset("s_grpo"), entropy_filter="quantile:0.5")
    h = hidden.clone().requires_grad_(True)
    loss, m = sgrpo_loss(h, weight, targets, adv, mask, cfg, bias=bias, token_weights=tw)
    loss.backward()
    assert m["filtered_frac"] > 0
    row_zero = (h.grad == 0).all(dim=-1)
    assert row_zero[~mask].all() and row_zero[0, 1]
    assert not row_zero.all()


def test_top_level_export_and_defaults():
    # the top-level name is added by the package's __init__ (lead); rl.sgrpo_loss is always there
    fn = getattr(sgrpo_kernels, "sgrpo_loss", rl.sgrpo_loss)
    assert fn is rl.sgrpo_loss
    hidden, weight, _, targets, mask, _, adv, _, _ = make(3)
    loss, m = sgrpo_loss(hidden, weight, targets, adv, mask, rl.preset("dr_grpo"))
    assert torch.isfinite(loss) and m["entropy_mean"] != m["entropy_mean"]  # no entropy computed by default: NaN


def test_bad_inputs():
    hidden, weight, _, targets, mask, _, adv, _, _ = make(4)
    cfg = rl.LossConfig()
    cases = [
        (lambda: sgrpo_loss(hidden[0], weight, targets, adv, mask, cfg), ValueError, "hidden"),
        (lambda: sgrpo_loss(hidden, weight, targets[:, :3], adv, mask, cfg), ValueError, "targets has shape (4, 3)"),
        (lambda: sgrpo_loss(hidden, weight, targets.float(), adv, mask, cfg), TypeError, "targets"),
        (lambda: sgrpo_loss(hidden, weight, targets, adv, mask.long() * 2, cfg), ValueError, "mask is an integer mask"),
        (lambda: sgrpo_loss(hidden, weight, targets, adv[:3], mask, cfg), ValueError, "advantages"),
        (lambda: sgrpo_loss(hidden, weight, targets, adv, mask, "grpo"), TypeError, "config"),
        (
            lambda: sgrpo_loss(hidden, weight, targets, adv, mask, rl.preset("s_grpo"), compute_entropy=False),
            ValueError,
            "compute_entropy",
        ),
    ]
    for call, exc, word in cases:
        assert_refused(call, exc, word)


def test_integer_01_masks_equal_bool_masks():
    """TRL's completion_mask is int64 0/1: accepted (it used to raise TypeError) and the same as the bool mask, through
    sgrpo_loss, policy_loss and conflict_weights."""
    hidden, weight, _, targets, mask, _, adv, _, _ = make(4)
    mask = mask.bool() if mask.dtype != torch.bool else mask
    cfg = rl.preset("gtpo")
    for as_int in (mask.long(), mask.int(), mask.to(torch.uint8)):
        a, ma = sgrpo_loss(hidden, weight, targets, adv, mask, cfg)
        b, mb = sgrpo_loss(hidden, weight, targets, adv, as_int, cfg)
        assert torch.equal(a, b) and all(torch.equal(ma[k], mb[k]) for k in ma)
        lp, ent = torch.randn(mask.shape, dtype=torch.float64), torch.rand(mask.shape, dtype=torch.float64)
        got = rl.policy_loss(lp, adv.double(), as_int, cfg, entropy=ent)[0]
        torch.testing.assert_close(got, rl.policy_loss(lp, adv.double(), mask, cfg, entropy=ent)[0])
        w1, c1 = rl.conflict_weights(targets, mask, adv, 2)
        w2, c2 = rl.conflict_weights(targets, as_int, adv, 2)
        assert torch.equal(w1, w2) and torch.equal(c1, c2)


def test_head_options_pass_through_as_given(monkeypatch):
    """sgrpo_loss forwards its head keywords to linear_logprobs unchanged (one object's fields, not a re-listed
    copy), uses their ignore_index for its own mask, and refuses an unknown keyword by name."""
    import sgrpo_kernels.rl.fused as fused

    hidden, weight, bias, targets, mask, _, adv, _, _ = make(5)
    seen = []
    real = fused.linear_logprobs

    def spy(*args, **kw):
        seen.append((args, kw))
        return real(*args, **kw)

    monkeypatch.setattr(fused, "linear_logprobs", spy)
    head = dict(temperature=0.8, ignore_index=-1, logit_scale=0.5, softcap=30.0)
    t = targets.clone()
    t[0, 0] = -1  # ignored under this ignore_index: out of the loss like a masked position
    loss, _ = sgrpo_loss(hidden, weight, t, adv, mask, rl.preset("dr_grpo"), bias=bias, **head)
    (_, _, eff_targets), kw = seen[0]
    assert torch.isfinite(loss) and {k: kw[k] for k in head} == head and kw["bias"] is bias
    assert eff_targets[0, 0] == -1 and (eff_targets[~mask] == -1).all()  # masked positions: this ignore_index
    with pytest.raises(TypeError, match=r"sgrpo_loss\(\) got an unexpected keyword argument 'temprature'"):
        sgrpo_loss(hidden, weight, targets, adv, mask, rl.preset("dr_grpo"), temprature=0.8)


@pytest.mark.parametrize("support", [dict(top_k=5), dict(top_p=0.8), dict(min_p=0.2), dict(top_k=9, top_p=0.9)])
def test_sgrpo_loss_scores_the_samplers_support(support):
    """top_k / top_p / min_p reach the op: the loss and its gradients are policy_loss on the float64 reference's
    log-probs and entropies of the truncated distribution (and differ from the full softmax's)."""
    hidden, weight, bias, targets, mask, rewards, adv, old, _ = make(7, torch.float64)
    cfg = rl.preset_with("grpo", "beta=0")
    leaves = [t.clone().requires_grad_(True) for t in (hidden, weight, bias)]
    loss, _ = sgrpo_loss(*leaves[:2], targets, adv, mask, cfg, bias=leaves[2], old_logp=old, backend="torch",
                         compute_entropy=True, **support)  # fmt: skip
    grads = torch.autograd.grad(loss, leaves)
    ref_leaves = [t.clone().requires_grad_(True) for t in (hidden, weight, bias)]
    safe = torch.where(mask, targets, torch.zeros_like(targets))  # the reference scores every row
    logp, ent = reference.linear_logprobs(*ref_leaves[:2], safe, bias=ref_leaves[2], out_dtype=torch.float64, **support)
    want, _ = rl.policy_loss(logp, adv, mask, cfg, entropy=ent, old_logp=old, vocab_size=V)
    want_grads = torch.autograd.grad(want, ref_leaves)
    torch.testing.assert_close(loss, want, rtol=1e-10, atol=1e-12)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-10)
    full, _ = sgrpo_loss(hidden, weight, targets, adv, mask, cfg, bias=bias, old_logp=old, backend="torch")
    assert not torch.allclose(full, loss)  # the support changed the loss


@pytest.mark.parametrize("cfg", [rl.preset("grpo"), rl.preset("dppo_tv")], ids=["grpo", "dppo_tv"])
def test_on_logp_hands_over_the_ops_own_logprobs(cfg):
    """on_logp gets the op's log-probs (detached, 0 where ignored: equal to a separate op call bit for bit) and what it
    returns is used as if given: loss and every gradient equal those of the call that passes the same inputs."""
    hidden, weight, bias, targets, mask, rewards, adv, old, ref = make(3)
    with torch.no_grad():
        separate = sgrpo_kernels.linear_logprobs(hidden, weight, targets, bias=bias, return_entropy=False).logp
    seen = {}

    def weights_from(logp):  # a TIS-like weight computed from the policy's own log-probs
        seen["logp"] = logp
        return {"token_weights": (logp - old).exp().clamp(max=2.0), "old_logp": old}

    def call(**extra):
        h, w, b = (x.clone().requires_grad_(True) for x in (hidden, weight, bias))
        loss, metrics = sgrpo_loss(h, w, targets, adv, mask, cfg, bias=b, ref_logp=ref, compute_entropy=True, **extra)
        loss.backward()
        return [loss.detach(), h.grad, w.grad, b.grad, metrics["ratio_mean"]]

    hooked = call(on_logp=weights_from, old_logp=old + 5.0)  # the hook's old_logp replaces the given one
    assert not seen["logp"].requires_grad and torch.equal(seen["logp"], separate)
    assert torch.equal(seen["logp"][~mask], torch.zeros(int((~mask).sum())))
    given = call(token_weights=(separate - old).exp().clamp(max=2.0), old_logp=old)
    for a, b in zip(hooked, given, strict=True):
        assert torch.equal(a, b)


def test_on_logp_bad_returns_refused():
    hidden, weight, bias, targets, mask, rewards, adv, old, ref = make(4)
    cfg = rl.preset("grpo")
    for bad, words in [(lambda lp: [lp], ["on_logp must return a mapping", "list"]),
                       (lambda lp: {"weights": lp}, ["on_logp returned 'weights'", "token_weights"])]:  # fmt: skip
        assert_refused(lambda bad=bad: sgrpo_loss(hidden, weight, targets, adv, mask, cfg, ref_logp=ref, on_logp=bad),
                       TypeError, words)  # fmt: skip
