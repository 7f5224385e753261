"""Real Ascend NPU: the npu backend (AscendC kernels through torch_npu) against the torch backend, via the public ops.

Marked `npu`; skipped cleanly unless torch_npu imports, an NPU is visible and the compiled extension is loaded
(build it with ASCEND_HOME_PATH + SOC_VERSION set, see csrc/README.md). Run on an Ascend machine with
`python -m pytest tests/test_npu_device.py -m npu -v`.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import sgrpo_kernels
from sgrpo_kernels import backends

pytestmark = pytest.mark.npu
IGNORE = -100


def _npu_status() -> str | None:
    if importlib.util.find_spec("torch_npu") is None:
        return "torch_npu is not installed"
    try:
        import torch_npu  # noqa: F401
    except Exception as exc:  # CANN libraries missing
        return f"torch_npu does not import: {exc}"
    if not torch.npu.is_available():
        return "no NPU visible"
    status = backends.available_backends()["npu"]
    return None if status == "available" else f"npu backend: {status}"


@pytest.fixture(scope="module")
def npu_device() -> torch.device:
    why = _npu_status()
    if why is not None:
        pytest.skip(why)
    return torch.device("npu")


def _inputs(device, n, v, d, dtype, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g).to(dtype)
    weight = (torch.randn(v, d, generator=g) / d**0.5 * 3).to(dtype)
    b = (torch.randn(v, generator=g) * 0.3).to(dtype) if bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    targets[::7] = IGNORE
    return [t.to(device) if t is not None else None for t in (hidden, weight, b, targets)]


def _run_linear(backend, hidden, weight, b, targets, gl, gh, budget):
    leaves = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
    if b is not None:
        leaves.append(b.clone().requires_grad_())
    logp, ent = sgrpo_kernels.linear_logprobs(leaves[0], leaves[1], targets, bias=leaves[2] if b is not None else None,
                                              temperature=0.9, backend=backend, memory_budget=budget)
    ((logp * gl).sum() + (ent * gh).sum()).backward()
    return [logp.detach(), ent.detach()] + [x.grad for x in leaves]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n,v,d", [(1, 7, 16), (300, 32003, 256), (4096, 151936, 128)])
def test_linear_logprobs_npu_vs_torch(npu_device, n, v, d, dtype, bias):
    hidden, weight, b, targets = _inputs(npu_device, n, v, d, dtype, bias)
    gl = torch.randn(n, device=npu_device)
    gh = torch.randn(n, device=npu_device)
    gl[::3] = 0
    gh[::3] = 0
    budget = 64 * 1024 * 1024
    got = _run_linear("npu", hidden, weight, b, targets, gl, gh, budget)
    ref = _run_linear("torch", hidden, weight, b, targets, gl, gh, budget)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    for name, x, y in zip(["logp", "entropy", "grad_hidden", "grad_weight", "grad_bias"], got, ref):
        torch.testing.assert_close(x.float().cpu(), y.float().cpu(), **tol, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n,v", [(1, 1), (33, 1001), (512, 151936)])
def test_logprobs_from_logits_npu_vs_torch(npu_device, n, v, dtype, inplace):
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(n, v, generator=g) * 4).to(dtype).to(npu_device)
    targets = torch.randint(0, v, (n,), generator=g).to(npu_device)
    targets[::5] = IGNORE
    gl, gh = torch.randn(n, device=npu_device), torch.randn(n, device=npu_device)
    out = {}
    for backend in ("npu", "torch"):
        x = logits.clone().requires_grad_()
        y = x * 1  # a non-leaf buffer so the in-place backward may reuse it
        logp, ent = sgrpo_kernels.logprobs_from_logits(y, targets, temperature=1.3, backend=backend,
                                                       inplace_backward=inplace and backend == "npu")
        ((logp * gl).sum() + (ent * gh).sum()).backward()
        out[backend] = (logp.detach().cpu(), ent.detach().cpu(), x.grad.float().cpu())
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-3)
    for a, b in zip(out["npu"], out["torch"]):
        torch.testing.assert_close(a, b, **tol)


def test_no_grad_forward_matches(npu_device):
    hidden, weight, _, targets = _inputs(npu_device, 64, 5000, 64, torch.bfloat16, False)
    with torch.no_grad():
        a = sgrpo_kernels.linear_logprobs(hidden, weight, targets, backend="npu")
        b = sgrpo_kernels.linear_logprobs(hidden, weight, targets, backend="torch")
    torch.testing.assert_close(a[0].cpu(), b[0].cpu(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(a[1].cpu(), b[1].cpu(), rtol=2e-2, atol=2e-2)
