"""The npu backend's Python orchestration (sgrpo_kernels/backends/npu_backend.py) on the CPU.

torch CPU matmuls stand in for the torch_npu cube matmuls and the CPU emulation of the AscendC kernels stands in for
torch.ops.sgrpo_npu (npu_backend.use_kernels), so vocab chunking, the running state across chunks, zero-gradient row
skipping, grad_hidden / grad_W / grad_b assembly and the in-place logits backward are checked against float64 here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from emu_loader import emu_module

from sgrpo_kernels import backends
from sgrpo_kernels.backends import BackendUnavailableError, Options
from sgrpo_kernels.backends import npu_backend as npu

ROOT = Path(__file__).resolve().parents[1]
IGNORE = -100
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")


@pytest.fixture(scope="module")
def emu_kernels():
    emu = emu_module()
    return emu.EmuKernels(emu.load(emu.build()), cores=5, ub_budget=48 * 1024, max_tile=512)


def ref_linear(hidden, weight, targets, bias, tau, gl, gh):
    """float64 logp, entropy and the gradients of sum(gl * logp + gh * entropy) by autograd."""
    h = hidden.double().requires_grad_()
    w = weight.double().requires_grad_()
    b = bias.double().requires_grad_() if bias is not None else None
    z = h @ w.t()
    if b is not None:
        z = z + b
    z = z / tau
    logsm = torch.log_softmax(z, -1)
    keep = targets != IGNORE
    logp = torch.where(keep, logsm.gather(1, targets.clamp(min=0)[:, None]).squeeze(1), torch.zeros_like(z[:, 0]))
    ent = torch.where(keep, -(logsm.exp() * logsm).sum(-1), torch.zeros_like(z[:, 0]))
    loss = (gl.double() * logp).sum() + (0 if gh is None else (gh.double() * ent).sum())
    grads = torch.autograd.grad(loss, [h, w] + ([b] if b is not None else []))
    return logp.detach(), ent.detach(), grads


def _close(out, ref, rtol, atol, what):
    err = (out.double() - ref).abs()
    tol = atol * ref.abs().max().clamp(min=1.0) + rtol * ref.abs()
    assert torch.isfinite(out).all(), what
    assert (err <= tol).all(), f"{what}: max err {err.max().item():.3g}"


def test_module_imports_without_torch_npu_and_reports_why():
    ok, why = npu.is_available()
    if ok:
        pytest.skip("torch_npu and the extension are present here")
    assert "torch_npu" in why or "extension" in why
    assert npu.DEVICE_TYPES == ("npu",)
    with pytest.raises(BackendUnavailableError, match="npu"):
        backends.resolve("npu", torch.device("cpu"))
    assert backends.available_backends()["npu"] != "available"


@pytest.mark.parametrize("n,v,d", [(1, 5, 3), (37, 1031, 24)])
def test_vocab_chunk_bounds(n, v, d):
    for budget in (0, 1, 4096, 10**6):
        c = npu.vocab_chunk(n, v, 2, budget)
        assert 1 <= c <= v
        assert c == v or c % npu.CHUNK_QUANTUM == 0


@needs_gxx
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("budget", [0, 3000], ids=["one-chunk", "many-chunks"])
def test_linear_logprobs_fwd_bwd(emu_kernels, dtype, bias, budget):
    n, v, d = 29, 1031, 40
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, d, generator=g).to(dtype)
    weight = (torch.randn(v, d, generator=g) / d**0.5 * 3).to(dtype)
    b = (torch.randn(v, generator=g) * 0.5).to(dtype) if bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    targets[::5] = IGNORE
    targets[1] = v - 1
    gl, gh = torch.randn(n, generator=g), torch.randn(n, generator=g)
    gl[3], gh[3] = 0.0, 0.0  # skipped row
    gh[7] = 0.0  # only g_logp
    tau = 0.8
    opts = Options(temperature=tau, ignore_index=IGNORE, memory_budget=budget)
    with npu.use_kernels(emu_kernels):
        logp, ent, stats = npu.linear_logprobs_fwd(hidden, weight, targets, b, opts)
        gh_, gw_, gb_ = npu.linear_logprobs_bwd(gl, gh, hidden, weight, targets, b, stats, ent, opts)
    r_logp, r_ent, grads = ref_linear(hidden, weight, targets, b, tau, gl, gh)
    # bf16: the [N, Vc] chunk matmul rounds logits to bf16 (as torch_npu's matmul does); fp32 everywhere else.
    lo = dtype == torch.bfloat16
    _close(logp, r_logp, 0, 3e-2 if lo else 2e-5, "logp")
    _close(ent, r_ent, 0, 3e-2 if lo else 2e-5, "entropy")
    assert gh_.dtype == dtype and gw_.dtype == dtype
    _close(gh_, grads[0], 3e-2 if lo else 1e-5, 3e-2 if lo else 1e-5, "grad_hidden")
    _close(gw_, grads[1], 3e-2 if lo else 1e-5, 3e-2 if lo else 1e-5, "grad_weight")
    if bias:
        _close(gb_, grads[2], 3e-2 if lo else 1e-5, 3e-2 if lo else 1e-5, "grad_bias")
    assert (gh_[targets == IGNORE] == 0).all() and (gh_[3] == 0).all()
    if budget:
        assert sum(1 for x in emu_kernels.launches[-40:] if x["kernel"] == "logits_grad") > 1


@needs_gxx
def test_linear_no_entropy_grad_and_all_rows_skipped(emu_kernels):
    n, v, d = 6, 300, 8
    g = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(n, d, generator=g), torch.randn(v, d, generator=g)
    targets = torch.randint(0, v, (n,), generator=g)
    opts = Options(return_entropy=False, memory_budget=1000)
    with npu.use_kernels(emu_kernels):
        logp, ent, stats = npu.linear_logprobs_fwd(hidden, weight, targets, None, opts)
        assert ent.numel() == 0
        gl = torch.randn(n, generator=g)
        gh_, gw_, _ = npu.linear_logprobs_bwd(gl, None, hidden, weight, targets, None, stats, None, opts)
        z_h, z_w, _ = npu.linear_logprobs_bwd(torch.zeros(n), None, hidden, weight, targets, None, stats, None, opts)
    r_logp, _, grads = ref_linear(hidden, weight, targets, None, 1.0, gl, None)
    _close(logp, r_logp, 0, 2e-5, "logp")
    _close(gh_, grads[0], 1e-5, 1e-5, "grad_hidden")
    _close(gw_, grads[1], 1e-5, 1e-5, "grad_weight")
    assert (z_h == 0).all() and (z_w == 0).all()


@needs_gxx
def test_confident_rows_give_logp_le_0_and_entropy_ge_0(emu_kernels):
    """The argmax sampled on sharp distributions (p(target) ~ 1): log p <= 0 and H >= 0 exactly, across chunks.
    The emulator's exact std::log keeps this even without the kernel's final clamp, which guards the hardware Ln."""
    n, v, d = 40, 300, 16
    g = torch.Generator().manual_seed(5)
    hidden, weight = torch.randn(n, d, generator=g) * 6, torch.randn(v, d, generator=g)
    targets = (hidden @ weight.T).argmax(-1)
    with npu.use_kernels(emu_kernels):
        logp, ent, _ = npu.linear_logprobs_fwd(hidden, weight, targets, None, Options(memory_budget=4000))
    assert (logp <= 0).all() and (ent >= 0).all()
    assert (logp > -1e-4).sum() >= n // 4  # many rows really are confident: the check is not vacuous


@needs_gxx
@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_logprobs_from_logits(emu_kernels, dtype, inplace):
    n, v = 33, 777
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(n, v, generator=g) * 4).to(dtype)
    targets = torch.randint(0, v, (n,), generator=g)
    targets[::4] = IGNORE
    gl, gh = torch.randn(n, generator=g), torch.randn(n, generator=g)
    tau = 1.7
    opts = Options(temperature=tau, ignore_index=IGNORE, inplace_backward=inplace)
    # float64 reference from the same (rounded) logits
    x = logits.double().requires_grad_()
    logsm = torch.log_softmax(x / tau, -1)
    keep = targets != IGNORE
    r_logp = torch.where(keep, logsm.gather(1, targets.clamp(min=0)[:, None]).squeeze(1), torch.zeros(n).double())
    r_ent = torch.where(keep, -(logsm.exp() * logsm).sum(-1), torch.zeros(n).double())
    (r_grad,) = torch.autograd.grad((gl.double() * r_logp).sum() + (gh.double() * r_ent).sum(), [x])
    buf = logits.clone()
    with npu.use_kernels(emu_kernels):
        logp, ent, stats = npu.logprobs_from_logits_fwd(buf, targets, opts)
        grad = npu.logprobs_from_logits_bwd(gl, gh, buf, targets, stats, ent, opts)
    _close(logp, r_logp, 0, 2e-5, "logp")
    _close(ent, r_ent, 0, 2e-5, "entropy")
    assert (grad.data_ptr() == buf.data_ptr()) == inplace
    rt = {torch.float32: 1e-5, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-10}[dtype]
    _close(grad, r_grad, rt, 2e-5, "grad_logits")
