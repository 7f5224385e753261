"""Vocab-parallel log-probs and entropy: the LM head (or the logits) sharded over the vocabulary across the ranks of a
`torch.distributed` process group, Megatron-style. Each rank runs the single-process op's backend on its shard with
shard-local targets, then a small combine all-reduces per-row statistics; the result is exactly the unsharded op.

Per rank r, for each row, the backend forward gives the shard's statistics of z = logits / T: m_r (max), log s_r
(log sum exp(z - m_r)), the shard's entropy H_r, and, on the rank that owns the target, its log-prob in the shard.
With M = max_r m_r (all-reduce MAX) and a_r = exp(m_r - M + log s_r) (the shard's share of sum exp(z - M)):

    S = sum_r a_r,   log S = log sum_j exp(z_j - M),
    E[z] - M = sum_r a_r * ((m_r - M) + log s_r - H_r) / S      (E_{p_r}[z] = m_r + log s_r - H_r)
    logp = (z_y - M) - log S,   entropy = log S - (E[z] - M)

(the three sums in one all-reduce SUM of a (3, N) tensor). The backward hands the backend the global statistics
(M, log S) and the global entropy, so its p_j = exp((z_j - M) - log S) are the global probabilities, and all-reduces
grad_hidden (N x D). Rows whose target lives on another rank run with target 0 of the shard; the gradient's
one-hot term for that index (`grad_logp / T` at column 0, times the head's slope there when the head is nonlinear,
`HeadOptions.head_slope`) is then subtracted again, exactly. The head options (`Options`, passed whole to each
shard's backend) act per logit, so each shard applies them.

Collectives per call: forward 3 (all-gather of the shard sizes, all-reduce MAX of an (N,) vector, all-reduce SUM of a
(3, N) tensor); backward of `linear_logprobs` 1 (all-reduce SUM of grad_hidden, N x D); backward of
`logprobs_from_logits` none. Never N x V.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import Tensor

from sgrpo_kernels.backends import Options, get, stats_dtype

__all__ = ["shard_range"]


def shard_range(local_size: int, group, device: torch.device) -> tuple[int, int, int]:
    """(offset, local_size, global_size) of this rank's contiguous vocabulary shard; shards are in rank order and may
    differ in size (an empty shard is allowed). One all-gather of the sizes."""
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, torch.tensor([local_size], dtype=torch.int64, device=device), group=group)
    sizes = [int(s) for s in sizes]
    rank = dist.get_rank(group)
    return sum(sizes[:rank]), local_size, sum(sizes)


def local_targets(targets: Tensor, offset: int, size: int, ignore_index: int) -> tuple[Tensor, Tensor, Tensor]:
    """(shard-local targets, owner mask, ignored mask): owned rows get their index in the shard, rows owned by another
    rank get 0, ignored rows keep `ignore_index`."""
    ignored = targets == ignore_index
    owner = (targets >= offset) & (targets < offset + size) & ~ignored
    local = torch.where(owner, targets - offset, torch.zeros_like(targets))
    return torch.where(ignored, torch.full_like(targets, ignore_index), local), owner, ignored


def combine(logp_r: Tensor, ent_r: Tensor, stats_r: Tensor, owner: Tensor, ignored: Tensor, empty: bool, group):
    """The shards' (logp, entropy, stats) -> the global ones; stats = (M, log S), 0 on ignored rows."""
    m_r = torch.full_like(logp_r, float("-inf")) if empty else stats_r[0]
    ls_r = torch.zeros_like(logp_r) if empty else stats_r[1]
    m_r = torch.where(ignored, torch.zeros_like(m_r), m_r)
    big_m = m_r.clone()
    dist.all_reduce(big_m, op=dist.ReduceOp.MAX, group=group)
    shift = m_r - big_m
    a_r = torch.exp(shift + ls_r)  # 0 for an empty shard
    e_r = torch.where(a_r > 0, shift + ls_r - ent_r, torch.zeros_like(a_r))
    z_y = torch.where(owner, logp_r + ls_r + shift, torch.zeros_like(a_r))  # z_y - M, on the owning rank
    sums = torch.stack([a_r, a_r * e_r, z_y])
    dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group)
    s = torch.where(ignored, torch.ones_like(sums[0]), sums[0])
    log_s = torch.log(s)
    zero = torch.zeros_like(log_s)
    logp = torch.where(ignored, zero, sums[2] - log_s)
    entropy = torch.where(ignored, zero, log_s - sums[1] / s)
    stats = torch.stack([torch.where(ignored, zero, big_m), torch.where(ignored, zero, log_s)])
    return logp, entropy, stats


def shard_forward(targets: Tensor, offset: int, size: int, opts: Options, group, like: Tensor, run):
    """The forward both ops share: shard-local targets, this shard's backend forward `run(local_targets, opts)`
    (skipped for an empty shard), the combine. -> (local targets, owner mask, logp, entropy, global stats)."""
    local, owner, ignored = local_targets(targets, offset, size, opts.ignore_index)
    if size == 0:
        logp_r, ent_r, stats_r = _nothing(targets.shape[0], like)
    else:
        logp_r, ent_r, stats_r = run(local, dataclasses.replace(opts, return_entropy=True, need_stats=True))
    logp, entropy, stats = combine(logp_r, ent_r, stats_r, owner, ignored, size == 0, group)
    return local, owner, logp, entropy, stats


class LinearVP(torch.autograd.Function):
    """linear_logprobs over a vocabulary-sharded head: forward(hidden (N, D), weight (V_r, D), targets (N,) global ids,
    bias (V_r,) | None, group, backend name, Options, offset of the shard) -> (logp, entropy). Targets already
    checked."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, bias, group, backend: str, opts: Options, offset: int):
        empty = weight.shape[0] == 0

        def run(local, inner):
            return get(backend).linear_logprobs_fwd(hidden, weight, local, bias, inner)

        local, owner, logp, entropy, stats = shard_forward(targets, offset, weight.shape[0], opts, group, hidden, run)
        ctx.save_for_backward(hidden, weight, local, owner, bias, stats, entropy)
        ctx.group, ctx.backend, ctx.opts, ctx.has_bias, ctx.empty = group, backend, opts, bias is not None, empty
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, local, owner, bias, stats, entropy = ctx.saved_tensors
        need_h, need_w, _, need_b = ctx.needs_input_grad[:4]
        need_b = ctx.has_bias and need_b
        g1, g2 = _upstream(grad_logp, grad_entropy, stats, entropy, ctx.opts)
        if ctx.empty:
            gh = torch.zeros_like(hidden) if need_h else None
            gw = torch.zeros_like(weight) if need_w else None
            gb = torch.zeros_like(bias) if need_b else None
        else:
            inner = dataclasses.replace(ctx.opts, return_entropy=True, need_stats=True, need_grad_hidden=need_h,
                                        need_grad_weight=need_w or need_b)  # fmt: skip
            args = (g1, g2, hidden, weight, local, bias, stats, entropy, inner)
            gh, gw, gb = get(ctx.backend).linear_logprobs_bwd(*args)
            foreign = _foreign(g1, owner, local, ctx.opts)  # rows run with target 0 of the shard: undo its one-hot
            if ctx.opts.nonlinear_head:  # ... which the backend passed through the head's slope at column 0
                raw0 = hidden.to(stats.dtype) @ weight[0].to(stats.dtype)
                if bias is not None:
                    raw0 = raw0 + bias[0].to(stats.dtype)
                foreign = foreign * ctx.opts.head_slope(raw0)
            if need_h:
                gh = (gh.to(stats.dtype) - foreign[:, None] * weight[0].to(stats.dtype)).to(hidden.dtype)
            if need_w:
                gw = gw.clone()
                gw[0] -= (foreign @ hidden.to(stats.dtype)).to(weight.dtype)
            if need_b:
                gb = gb.clone()
                gb[0] -= foreign.sum().to(bias.dtype)
        if need_h:
            gh = gh.contiguous()
            dist.all_reduce(gh, op=dist.ReduceOp.SUM, group=ctx.group)
        return gh if need_h else None, gw if need_w else None, None, gb if need_b else None, None, None, None, None


class LogitsVP(torch.autograd.Function):
    """logprobs_from_logits over vocabulary-sharded logits: forward(logits (N, V_r), targets (N,) global ids, group,
    backend name, Options, offset of the shard) -> (logp, entropy)."""

    @staticmethod
    def forward(ctx, logits, targets, group, backend: str, opts: Options, offset: int):
        empty = logits.shape[1] == 0

        def run(local, inner):
            return get(backend).logprobs_from_logits_fwd(logits, local, inner)

        local, owner, logp, entropy, stats = shard_forward(targets, offset, logits.shape[1], opts, group, logits, run)
        ctx.save_for_backward(logits, local, owner, stats, entropy)
        ctx.backend, ctx.opts, ctx.empty = backend, opts, empty
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        logits, local, owner, stats, entropy = ctx.saved_tensors
        if ctx.empty:
            return torch.zeros_like(logits), None, None, None, None, None
        g1, g2 = _upstream(grad_logp, grad_entropy, stats, entropy, ctx.opts)
        inner = dataclasses.replace(ctx.opts, return_entropy=True, need_stats=True, inplace_backward=False)
        grad = get(ctx.backend).logprobs_from_logits_bwd(g1, g2, logits, local, stats, entropy, inner)
        grad[:, 0] -= _foreign(g1, owner, local, ctx.opts).to(grad.dtype)
        return grad, None, None, None, None, None


def _nothing(n: int, like: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """An empty shard's (logp, entropy, stats): zeros (its combine weight is 0)."""
    kw = dict(dtype=stats_dtype(like.dtype), device=like.device)
    return torch.zeros(n, **kw), torch.zeros(n, **kw), torch.zeros(2, n, **kw)


def _upstream(grad_logp, grad_entropy, stats: Tensor, entropy: Tensor, opts: Options):
    g1 = (grad_logp if grad_logp is not None else torch.zeros_like(entropy)).to(stats.dtype)
    g2 = grad_entropy.to(stats.dtype) if (opts.return_entropy and grad_entropy is not None) else None
    return g1, g2


def _foreign(g1: Tensor, owner: Tensor, local: Tensor, opts: Options) -> Tensor:
    """(N,) grad_logp / T on the rows whose target lives on another rank (they ran with target 0 of this shard):
    the one-hot term the backend added at column 0, to be subtracted."""
    return g1 * (~owner & (local != opts.ignore_index)) / opts.temperature
