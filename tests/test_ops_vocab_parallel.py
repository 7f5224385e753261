"""Vocab-parallel ops (`process_group=`): 2 and 3 gloo ranks on this CPU, unequal shards and an empty one, against
the unsharded op in float64: logp, entropy, grad_hidden, grad_weight, grad_bias (and grad_logits), with ignored rows,
zero-gradient rows, temperature and bias."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from procs import spawn_gloo

from sgrpo_kernels import LogProbs, linear_logprobs, logprobs_from_logits, sgrpo_loss
from sgrpo_kernels.rl import preset

IGNORE = -100


def _case(sizes: list[int], n: int, d: int, temperature: float, bias: bool, seed: int):
    """The full problem (same on every rank): hidden, weight, bias, targets (some ignored, some in every non-empty
    shard), upstream gradients with zero rows."""
    g = torch.Generator().manual_seed(seed)
    v = sum(sizes)
    hidden = torch.randn(n, d, generator=g, dtype=torch.float64)
    weight = torch.randn(v, d, generator=g, dtype=torch.float64) * 2
    b = torch.randn(v, generator=g, dtype=torch.float64) if bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    targets[1] = IGNORE
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    for i, (o, s) in enumerate(zip(offsets, sizes)):  # at least one target in each non-empty shard
        if s:
            targets[2 + i] = o + s - 1
    g_logp = torch.randn(n, generator=g, dtype=torch.float64)
    g_ent = torch.randn(n, generator=g, dtype=torch.float64)
    g_logp[0] = g_ent[0] = 0.0  # a zero-gradient row
    g_ent[3] = 0.0  # a row with a log-prob gradient only
    return hidden, weight, b, targets, g_logp, g_ent, offsets


def _grads(out, inputs, g_logp, g_ent, return_entropy: bool):
    logp, ent = out
    loss = (logp * g_logp).sum() + ((ent * g_ent).sum() if return_entropy else 0.0)
    return torch.autograd.grad(loss, inputs)


def _worker(rank: int, world: int, cases: list) -> None:
    for sizes, n, d, temperature, bias, return_entropy, seed, *head in cases:
        hidden, weight, b, targets, g_logp, g_ent, offsets = _case(sizes, n, d, temperature, bias, seed)
        lo, hi = offsets[rank], offsets[rank] + sizes[rank]
        kw = dict(temperature=temperature, return_entropy=return_entropy, backend="torch")
        if head:  # head options: (logit_scale, softcap), applied per shard like the rest of the row
            kw |= dict(logit_scale=head[0], softcap=head[1])
        what = f"sizes={sizes} T={temperature} bias={bias} entropy={return_entropy} rank={rank}"

        # reference: the unsharded op on the full head
        h0, w0 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        b0 = b.clone().requires_grad_() if bias else None
        ref = linear_logprobs(h0, w0, targets, bias=b0, **kw)
        ref_g = _grads(ref, [h0, w0] + ([b0] if bias else []), g_logp, g_ent, return_entropy)

        h1 = hidden.clone().requires_grad_()
        w1 = weight[lo:hi].clone().requires_grad_()
        b1 = b[lo:hi].clone().requires_grad_() if bias else None
        out = linear_logprobs(h1, w1, targets, bias=b1, process_group=dist.group.WORLD, **kw)
        got_g = _grads(out, [h1, w1] + ([b1] if bias else []), g_logp, g_ent, return_entropy)
        assert type(out) is LogProbs and out.max_logprob is None  # the unsharded op's result type

        torch.testing.assert_close(out[0], ref[0], rtol=1e-12, atol=1e-12, msg=f"logp {what}")
        if return_entropy:
            torch.testing.assert_close(out[1], ref[1], rtol=1e-12, atol=1e-12, msg=f"entropy {what}")
        else:
            assert out[1] is None
        torch.testing.assert_close(got_g[0], ref_g[0], rtol=1e-10, atol=1e-12, msg=f"grad_hidden {what}")
        torch.testing.assert_close(got_g[1], ref_g[1][lo:hi], rtol=1e-10, atol=1e-12, msg=f"grad_weight {what}")
        if bias:
            torch.testing.assert_close(got_g[2], ref_g[2][lo:hi], rtol=1e-10, atol=1e-12, msg=f"grad_bias {what}")
        assert out[0][1] == 0 and got_g[0][0].abs().max() == 0  # ignored row; zero-gradient row

        if head:
            continue  # (logprobs_from_logits takes finished logits: no head options)
        # logprobs_from_logits over the same logits, sharded
        logits = hidden @ weight.T + (b if bias else 0)
        l0 = logits.clone().requires_grad_()
        ref = logprobs_from_logits(l0, targets, **kw)
        (ref_gl,) = _grads(ref, [l0], g_logp, g_ent, return_entropy)
        l1 = logits[:, lo:hi].clone().requires_grad_()
        out = logprobs_from_logits(l1, targets, process_group=dist.group.WORLD, **kw)
        (got_gl,) = _grads(out, [l1], g_logp, g_ent, return_entropy)
        torch.testing.assert_close(out[0], ref[0], rtol=1e-12, atol=1e-12, msg=f"logits logp {what}")
        if return_entropy:
            torch.testing.assert_close(out[1], ref[1], rtol=1e-12, atol=1e-12, msg=f"logits entropy {what}")
        torch.testing.assert_close(got_gl, ref_gl[:, lo:hi], rtol=1e-10, atol=1e-12, msg=f"grad_logits {what}")

    # sgrpo_loss over the sharded head: the same loss on every rank, this rank's shard of the weight gradient
    sizes = cases[0][0]
    lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
    g = torch.Generator().manual_seed(7)
    b_, t_, d_ = 4, 5, 3
    hidden = torch.randn(b_, t_, d_, generator=g, dtype=torch.float64)
    weight = torch.randn(sum(sizes), d_, generator=g, dtype=torch.float64)
    targets = torch.randint(0, sum(sizes), (b_, t_), generator=g)
    mask = torch.rand(b_, t_, generator=g) > 0.2
    adv = torch.randn(b_, generator=g, dtype=torch.float64)
    cfg = preset("grpo_ef")  # entropy floor: the loss uses the entropies too
    outs = []
    for w_, group in ((weight, None), (weight[lo:hi], dist.group.WORLD)):
        h_, w_ = hidden.clone().requires_grad_(), w_.clone().requires_grad_()
        loss, _ = sgrpo_loss(h_, w_, targets, adv, mask, cfg, temperature=0.8, backend="torch",
                             process_group=group)  # fmt: skip
        outs.append((loss, *torch.autograd.grad(loss, [h_, w_])))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(outs[1][2], outs[0][2][lo:hi], rtol=1e-10, atol=1e-12)

    # targets are checked against the global vocabulary, on every rank
    v = sum(cases[0][0])
    w = torch.randn(cases[0][0][rank], 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=f"out of range|\\[0, {v}\\)"):
        linear_logprobs(torch.randn(2, 3, dtype=torch.float64), w, torch.tensor([0, v]),
                        process_group=dist.group.WORLD, backend="torch")  # fmt: skip


def _spawn(world: int, cases: list) -> None:
    spawn_gloo(_worker, (cases,), nprocs=world)


def test_vocab_parallel_three_ranks_unequal_and_empty_shard():
    _spawn(
        3,
        [
            ([5, 0, 8], 9, 4, 0.7, True, True, 0),  # an empty shard in the middle, bias, temperature
            ([1, 6, 2], 7, 3, 1.0, False, True, 1),
            ([4, 4, 0], 6, 5, 1.3, True, False, 2),  # log-probs only; the last shard empty
            ([3, 0, 9], 7, 4, 0.8, True, True, 5, 0.5, 2.0),  # Gemma-style softcap after a logit scale
        ],
    )


def test_vocab_parallel_two_ranks():
    _spawn(2, [([6, 7], 8, 4, 1.0, True, True, 3), ([3, 11], 5, 2, 0.5, False, True, 4)])


def test_process_group_errors():
    w = torch.randn(4, 3)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        linear_logprobs(torch.randn(2, 3), w, torch.tensor([0, 1]), process_group=object())
    with pytest.raises(ValueError, match="vocabulary must not be empty"):
        linear_logprobs(torch.randn(2, 3), torch.randn(0, 3), torch.tensor([0, 1]))  # no group: empty refused
