"""Triton-backend specific checks, beyond the shared op suite (tests/test_ops.py runs that one over this backend too).

- CPU, under TRITON_INTERPRET=1 (the real kernels, interpreted; small shapes): split-vocab forward and its merge,
  device-side compaction, zero-gradient-row skipping (bitwise identical to running without those rows), bitwise
  run-to-run determinism, vocab chunking of the backward, fp64 inputs, outputs poisoned with NaN before the kernels run.
  The backend's entry points are called directly, with the test hooks passed explicitly (`hooks=POISON`: NaN-filled
  buffers, so an unwritten element fails the comparisons; `Hooks(splits=k)`: k vocab splits in the forward).
- CUDA (marked `gpu`, skipped without a device): real shapes D=4096, V=131072 and 151936 in bf16 against float64 on a
  sample of rows, determinism and skipping at those shapes, and 1M rows (no grid-dimension overflow).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from sgrpo_kernels import backends
from sgrpo_kernels import reference as ref
from sgrpo_kernels.backends import Options

tb = pytest.importorskip("sgrpo_kernels.backends.triton_backend", reason="triton is not installed")
from sgrpo_kernels.backends.triton_backend import Hooks, configs, launchers  # noqa: E402

IGNORE = -100
_INTERP = os.environ.get("TRITON_INTERPRET") == "1"
_STATUS = backends.available_backends().get("triton")

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        not _INTERP or _STATUS != "available", reason="CPU tensors run the kernels only under TRITON_INTERPRET=1")),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        _INTERP or not torch.cuda.is_available() or _STATUS != "available", reason="needs a CUDA device")]),
]

POISON = Hooks(poison=True)  # output and scratch buffers start as NaN: an element no kernel wrote fails the checks


def _case(n, d, v, *, device, dtype=torch.float32, bias=True, ignore_frac=0.2, zero_frac=0.4, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(n, d, generator=g, dtype=torch.float64) * scale / math.sqrt(d)).to(device, dtype)
    w = torch.randn(v, d, generator=g, dtype=torch.float64).to(device, dtype)
    b = (torch.randn(v, generator=g, dtype=torch.float64) * 0.5).to(device, dtype) if bias else None
    t = torch.randint(0, v, (n,), generator=g)
    t[torch.rand(n, generator=g) < ignore_frac] = IGNORE
    gl = torch.randn(n, generator=g)
    ge = torch.randn(n, generator=g)
    dead = torch.rand(n, generator=g) < zero_frac
    gl[dead] = 0
    ge[dead] = 0
    return h, w, t.to(device), b, gl.to(device), ge.to(device)


def _fwd_bwd(h, w, t, b, gl, ge, **kw):
    opts = Options(**kw)
    logp, ent, stats = tb.linear_logprobs_fwd(h, w, t, b, opts, hooks=POISON)
    grads = tb.linear_logprobs_bwd(gl, ge, h, w, t, b, stats, ent, opts, hooks=POISON)
    return logp, ent, stats, grads


def _exact(h, w, t, b, gl, ge, temperature=1.0):
    """float64 reference values and gradients (the specification, reference.py)."""
    leaves = [x.detach().double().requires_grad_(True) for x in (h, w) + ((b,) if b is not None else ())]
    logp, ent = ref.linear_logprobs(leaves[0], leaves[1], t, bias=leaves[2] if b is not None else None,
                                    temperature=temperature, out_dtype=None)
    loss = (logp * gl.double()).sum() + (ent * ge.double()).sum()
    grads = torch.autograd.grad(loss, leaves)
    return logp.detach(), ent.detach(), grads


def _bitwise(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.uint8) if a.dtype != torch.bool else a,
                                              b.view(torch.uint8) if b.dtype != torch.bool else b)


# ------------------------------------------------------------------------------------------- interpreter (CPU)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits", [1, 2, 3, 5])
def test_forward_vocab_split_and_merge(device, splits):
    """Every split count (the merge kernel included) gives the float64 answer; ignored rows give exact zeros."""
    hooks = Hooks(splits=splits, poison=True)
    # a split spans a multiple of the widest vocab tile: 32 columns in the interpreter, 256 on a GPU (SPLIT_ALIGN), so
    # 5 splits need more than 4 * 256 columns there (at V=150 a GPU launch has one split, whatever is asked)
    vocab = 150 if device == "cpu" else 1100
    h, w, t, b, *_ = _case(21, 24, vocab, device=device)
    assert launchers._num_splits(21, vocab, h, hooks.splits)[0] == splits  # the hook reaches the launch
    for return_entropy, need_stats in [(True, True), (False, True), (True, False)]:
        opts = Options(temperature=0.8, return_entropy=return_entropy, need_stats=need_stats)
        logp, ent, stats = tb.linear_logprobs_fwd(h, w, t, b, opts, hooks=hooks)
        exp_logp, exp_ent, _ = _exact(h, w, t, b, torch.zeros(21, device=device), torch.zeros(21, device=device),
                                      temperature=0.8)
        torch.testing.assert_close(logp.double(), exp_logp, atol=2e-5, rtol=2e-5)
        assert ent.numel() == (21 if return_entropy else 0) and stats.shape == (2, 21 if need_stats else 0)
        if return_entropy:
            torch.testing.assert_close(ent.double(), exp_ent, atol=2e-5, rtol=2e-5)
        ignored = t == IGNORE
        assert (logp[ignored] == 0).all()
        if need_stats:  # [row max m; log s], 0 on ignored rows
            z = ((h.double() @ w.double().T + b.double()) / 0.8)[~ignored]
            m = z.max(-1).values
            torch.testing.assert_close(stats[0, ~ignored].double(), m, atol=2e-5, rtol=2e-5)
            torch.testing.assert_close(stats[1, ~ignored].double(), torch.logsumexp(z - m[:, None], -1), atol=2e-5,
                                       rtol=2e-5)
            assert (stats[:, ignored] == 0).all()


def test_poison_hook_reaches_the_buffers():
    """hooks=POISON fills the launchers' buffers with NaN (what makes the poisoned checks above meaningful)."""
    assert torch.isnan(launchers._new((3, 4), torch.empty(0), POISON)).all()


@pytest.mark.parametrize("device", DEVICES)
def test_compaction_lists_active_rows_in_order(device):
    g = torch.Generator().manual_seed(1)
    n = 3000  # several compaction blocks
    t = torch.randint(0, 7, (n,), generator=g)
    t[torch.rand(n, generator=g) < 0.3] = IGNORE
    gl = torch.randn(n, generator=g) * (torch.rand(n, generator=g) < 0.5)
    ge = torch.randn(n, generator=g) * (torch.rand(n, generator=g) < 0.5)
    t, gl, ge = t.to(device), gl.to(device), ge.to(device)
    idx, count = launchers._compact_active_rows(t, gl, ge, IGNORE)
    want = torch.nonzero((t != IGNORE) & ((gl != 0) | (ge != 0))).squeeze(1)
    assert count.device == t.device and count.numel() == 1
    assert int(count.item()) == want.numel()
    assert torch.equal(idx[: want.numel()].long().cpu(), want.cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False])
def test_zero_gradient_rows_skipped_bitwise(device, bias):
    """Skipping rows with zero upstream gradient (and ignored rows) is exact: the gradients are bitwise those of a call
    on the active rows alone, inactive rows get exact zeros, and the result matches float64."""
    h, w, t, b, gl, ge = _case(37, 20, 70, device=device, bias=bias, ignore_frac=0.25, zero_frac=0.4, seed=3)
    big = 1 << 40  # one vocab chunk in both calls, so the chunking is identical
    opts = Options(temperature=1.3, memory_budget=big)
    logp, ent, stats = tb.linear_logprobs_fwd(h, w, t, b, opts, hooks=POISON)
    gh, gw, gb = tb.linear_logprobs_bwd(gl, ge, h, w, t, b, stats, ent, opts, hooks=POISON)
    a = (t != IGNORE) & ((gl != 0) | (ge != 0))
    assert 0 < int(a.sum()) < 37
    # the same row statistics for the subset call (the forward's vocab split may differ with the row count)
    gh_a, gw_a, gb_a = tb.linear_logprobs_bwd(gl[a], ge[a], h[a], w, t[a], b, stats[:, a], ent[a], opts, hooks=POISON)
    assert _bitwise(gw, gw_a)
    if bias:
        assert _bitwise(gb, gb_a)
    assert _bitwise(gh[a], gh_a)
    assert (gh[~a] == 0).all()
    _, _, (egh, egw, *egb) = _exact(h, w, t, b, gl, ge, temperature=1.3)
    torch.testing.assert_close(gh.double(), egh, atol=5e-5, rtol=5e-5)
    torch.testing.assert_close(gw.double(), egw, atol=5e-5, rtol=5e-5)
    if bias:
        torch.testing.assert_close(gb.double(), egb[0], atol=5e-5, rtol=5e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_no_active_rows_gives_zero_gradients(device):
    h, w, t, b, gl, ge = _case(9, 16, 40, device=device)
    gl.zero_()
    ge.zero_()
    _, _, _, (gh, gw, gb) = _fwd_bwd(h, w, t, b, gl, ge)
    assert (gh == 0).all() and (gw == 0).all() and (gb == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_backward_bitwise_reproducible(device):
    """Deterministic by construction (no atomics; there is no deterministic option): three runs are bitwise equal."""
    h, w, t, b, gl, ge = _case(40, 24, 130, device=device, seed=7)
    runs = [_fwd_bwd(h, w, t, b, gl, ge, memory_budget=1) for _ in range(3)]
    for other in runs[1:]:
        for x, y in zip([*runs[0][:3], *runs[0][3]], [*other[:3], *other[3]]):
            assert _bitwise(x, y)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_vocab_chunking(device):
    """Tiny memory budget (one BLOCK_V per chunk, many chunks) and one chunk agree with float64."""
    h, w, t, b, gl, ge = _case(19, 33, 101, device=device, seed=11)
    _, _, (egh, egw, egb) = _exact(h, w, t, b, gl, ge, temperature=0.7)
    for budget in (1, 0, 1 << 40):
        _, _, _, (gh, gw, gb) = _fwd_bwd(h, w, t, b, gl, ge, temperature=0.7, memory_budget=budget)
        torch.testing.assert_close(gh.double(), egh, atol=5e-5, rtol=5e-5)
        torch.testing.assert_close(gw.double(), egw, atol=5e-5, rtol=5e-5)
        torch.testing.assert_close(gb.double(), egb, atol=5e-5, rtol=5e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_float64_inputs_computed_in_float32(device):
    """fp64 is accepted (computed in fp32, documented): fp32-level accuracy, outputs and gradients returned in fp64."""
    h, w, t, b, gl, ge = _case(11, 16, 50, device=device, dtype=torch.float64)
    logp, ent, stats, (gh, gw, gb) = _fwd_bwd(h, w, t, b, gl, ge)
    elogp, eent, (egh, egw, egb) = _exact(h, w, t, b, gl, ge)
    assert gh.dtype == gw.dtype == gb.dtype == torch.float64
    assert logp.dtype == ent.dtype == stats.dtype == torch.float64
    torch.testing.assert_close(logp.double(), elogp, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(gw, egw, atol=5e-5, rtol=5e-5)
    z = torch.randn(6, 30, dtype=torch.float64, device=device)
    tt = torch.randint(0, 30, (6,), device=device)
    opts = Options(inplace_backward=True)
    lp, en, ls = tb.logprobs_from_logits_fwd(z, tt, opts, hooks=POISON)
    zr = z.clone().requires_grad_(True)
    lr, er = ref.logprobs_from_logits(zr, tt, out_dtype=None)
    (lr.sum() + er.sum()).backward()
    out = tb.logprobs_from_logits_bwd(torch.ones(6, device=device), torch.ones(6, device=device), z, tt, ls, en, opts,
                                      hooks=POISON)
    assert lp.dtype == en.dtype == ls.dtype == torch.float64
    assert out.data_ptr() == z.data_ptr() and out.dtype == torch.float64
    torch.testing.assert_close(out, zr.grad, atol=5e-5, rtol=5e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inplace", [False, True])
def test_logits_backward_rows_without_gradient_are_zero(device, inplace):
    g = torch.Generator().manual_seed(2)
    z = (torch.randn(30, 77, generator=g) * 3).to(device)
    t = torch.randint(0, 77, (30,), generator=g).to(device)
    t[::5] = IGNORE
    gl = torch.randn(30, generator=g).to(device)
    ge = torch.randn(30, generator=g).to(device)
    gl[1::3] = 0
    ge[1::3] = 0
    opts = Options(temperature=1.4, inplace_backward=inplace)
    logp, ent, stats = tb.logprobs_from_logits_fwd(z, t, opts, hooks=POISON)
    zr = z.double().requires_grad_(True)
    lr, er = ref.logprobs_from_logits(zr, t, temperature=1.4, out_dtype=None)
    ((lr * gl.double()).sum() + (er * ge.double()).sum()).backward()
    buf = z.clone()
    out = tb.logprobs_from_logits_bwd(gl, ge, buf, t, stats, ent, opts, hooks=POISON)
    assert (out.data_ptr() == buf.data_ptr()) == inplace
    torch.testing.assert_close(out.double(), zr.grad, atol=5e-5, rtol=5e-5)
    dead = (t == IGNORE) | ((gl == 0) & (ge == 0))
    assert (out[dead] == 0).all()


# --------------------------------------------------------------------------------------------------- GPU only

gpu = pytest.mark.skipif(_INTERP or not torch.cuda.is_available() or _STATUS != "available",
                         reason="needs a CUDA device (and no interpreter)")


def _low_precision_check(got, naive, exact, tol):
    """|ours - fp64| <= 2 |naive same-dtype - fp64| + tol * max|fp64| (docs/design.md, "Accuracy")."""
    err = (got.double() - exact).abs().max().item()
    err_naive = (naive.double() - exact).abs().max().item()
    assert err <= 2 * err_naive + tol * max(1.0, exact.abs().max().item()), (err, err_naive)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("vocab", [131072, 151936])
@pytest.mark.parametrize("zero_frac", [0.0, 0.5])
def test_gpu_real_shapes_bf16_vs_float64(vocab, zero_frac):
    """D=4096, bf16, 512 sampled rows: values and all gradients within the error of naive bf16 PyTorch vs float64."""
    torch.manual_seed(0)
    n, d = 512, 4096
    h, w, t, b, gl, ge = _case(n, d, vocab, device="cuda", dtype=torch.bfloat16, bias=False, ignore_frac=0.1,
                               zero_frac=zero_frac, scale=4.0)
    w = (w / math.sqrt(d) * 8).to(torch.bfloat16)  # logits of O(10), as an LM head gives
    logp, ent, stats, (gh, gw, _) = _fwd_bwd(h, w, t, None, gl, ge, temperature=0.9)
    assert torch.isfinite(logp).all() and torch.isfinite(gh.float()).all() and torch.isfinite(gw.float()).all()
    hn, wn = h.detach().requires_grad_(True), w.detach().requires_grad_(True)
    lp_n, en_n = ref.linear_logprobs(hn, wn, t, temperature=0.9)
    gh_n, gw_n = torch.autograd.grad((lp_n * gl).sum() + (en_n * ge).sum(), (hn, wn))
    he, we = h.double().requires_grad_(True), w.double().requires_grad_(True)
    lp_e, en_e = ref.linear_logprobs(he, we, t, temperature=0.9, out_dtype=None)
    gh_e, gw_e = torch.autograd.grad((lp_e * gl.double()).sum() + (en_e * ge.double()).sum(), (he, we))
    rows = torch.randperm(vocab, device="cuda")[:4096]  # grad_W compared on a sample of vocab rows
    for got, nv, ex in [(logp, lp_n, lp_e), (ent, en_n, en_e), (gh, gh_n, gh_e), (gw[rows], gw_n[rows], gw_e[rows])]:
        _low_precision_check(got, nv, ex, 1e-2)
    dead = (t == IGNORE) | ((gl == 0) & (ge == 0))
    assert (gh[dead] == 0).all()


@pytest.mark.gpu
@gpu
def test_gpu_deterministic_and_skipping_at_real_shape():
    n, d, vocab = 2048, 4096, 131072
    h, w, t, b, gl, ge = _case(n, d, vocab, device="cuda", dtype=torch.bfloat16, bias=True, zero_frac=0.5)
    runs = [_fwd_bwd(h, w, t, b, gl, ge) for _ in range(2)]
    for x, y in zip(runs[0][3], runs[1][3]):
        assert _bitwise(x, y)
    a = (t != IGNORE) & ((gl != 0) | (ge != 0))
    opts = Options(memory_budget=1 << 40)
    _, ent, stats = tb.linear_logprobs_fwd(h, w, t, b, opts, hooks=POISON)
    full = tb.linear_logprobs_bwd(gl, ge, h, w, t, b, stats, ent, opts, hooks=POISON)
    only = tb.linear_logprobs_bwd(gl[a], ge[a], h[a], w, t[a], b, stats[:, a], ent[a], opts, hooks=POISON)
    assert _bitwise(full[1], only[1]) and _bitwise(full[2], only[2]) and _bitwise(full[0][a], only[0])
    assert (full[0][~a] == 0).all()


@pytest.mark.gpu
@gpu
def test_gpu_one_million_rows():
    """2^20 rows: grid axis 0 carries the rows (no 65535 limit); int64 offsets."""
    n, d, vocab = 1 << 20, 64, 1000
    h, w, t, b, gl, ge = _case(n, d, vocab, device="cuda", dtype=torch.bfloat16, zero_frac=0.5)
    logp, ent, stats, (gh, gw, gb) = _fwd_bwd(h, w, t, b, gl, ge)
    rows = torch.randint(0, n, (2048,), device="cuda")
    elogp, eent, _ = _exact(h[rows], w, t[rows], b, gl[rows], ge[rows])
    torch.testing.assert_close(logp[rows].double(), elogp, atol=5e-3, rtol=5e-3)
    torch.testing.assert_close(ent[rows].double(), eent, atol=5e-3, rtol=5e-3)
    assert torch.isfinite(gw.float()).all() and torch.isfinite(gh.float()).all()
    z = torch.randn(n, 128, device="cuda", dtype=torch.bfloat16)
    lp, en, _ = tb.logprobs_from_logits_fwd(z, t.clamp(max=127), Options(), hooks=POISON)
    lr, er = ref.logprobs_from_logits(z[rows].double(), t.clamp(max=127)[rows], out_dtype=None)
    torch.testing.assert_close(lp[rows].double(), lr, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("triton_v, numpy_v, ok", [
    ("3.6.0", "2.4.6", False), ("3.5.1", "2.5.0", False), ("3.6.0", "2.3.5", True), ("3.7.0", "2.4.6", True),
    ("3.9.0", "2.5.2", True), ("3.6.0+git1234", "2.4.0rc1", False),
])
def test_interpreter_numpy_compatibility_is_explained(triton_v, numpy_v, ok):
    """Triton <= 3.6's interpreter fails with numpy >= 2.4 deep inside a kernel (measured: triton 3.6.0 + numpy 2.4.6
    raises 'only 0-dimensional arrays can be converted'); the backend reports that combination up front instead."""
    why = tb._interpreter_problem(triton_v, numpy_v)
    assert (why == "") == ok
    if not ok:
        assert f"triton {triton_v}" in why and "numpy < 2.4" in why and "triton>=3.7" in why


@pytest.mark.parametrize("value, enabled", [(None, True), ("1", True), ("0", False), ("off", False), ("False", False)])
def test_autotune_switch(monkeypatch, value, enabled):
    if value is None:
        monkeypatch.delenv(configs.ENV_AUTOTUNE, raising=False)
    else:
        monkeypatch.setenv(configs.ENV_AUTOTUNE, value)
    assert configs.autotune_enabled() is enabled


@pytest.mark.parametrize("hopper", [True, False])
@pytest.mark.parametrize("fp32", [True, False])
def test_fixed_config_is_the_first_autotune_candidate(hopper, fp32):
    """SGRPO_TRITON_AUTOTUNE=0 runs each kernel with the first config autotuning would try (built without a GPU)."""
    lists = {
        "fwd": configs.tile_configs(hopper, fp32=fp32),
        "dz": configs.tile_configs(hopper, epilogue_heavy=True, fp32=fp32),
        "dh": configs.gemm_configs(hopper, "BLOCK_M", "BLOCK_D", "BLOCK_K", fp32),
        "dw": configs.gemm_configs(hopper, "BLOCK_V", "BLOCK_D", "BLOCK_K", fp32),
        "logits_fwd": configs.logits_fwd_configs(),
    }
    for name, candidates in lists.items():
        cfg = configs.fixed_config(name, hopper, fp32)
        first = candidates[0]
        assert (cfg.kwargs, cfg.num_warps, cfg.num_stages) == (first.kwargs, first.num_warps, first.num_stages), name
