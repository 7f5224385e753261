"""The torch_npu binding (csrc/ascend/sgrpo_binding.cpp) compiled against the local CPU torch, run on CPU tensors.

csrc/scripts/check_binding_cpu.sh builds it with stub torch_npu / CANN headers (csrc/tests/stubs), links the
CPU-emulated kernels and registers the same implementations for CPU (-DSGRPO_BINDING_CPU_TEST). This checks the op
schemas, the binding's argument checks, the tiling/launcher marshalling and npu_backend's torch.ops path end to end;
not torch_npu's OpCommand queue, the real stream or CANN. The .so is cached per source hash in the temp dir
(first build ~40 s).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from sgrpo_kernels.backends import Options
from sgrpo_kernels.backends import npu_backend as npu

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")]
CSRC = Path(__file__).resolve().parents[1] / "csrc"
IGNORE = -100


@pytest.fixture(scope="module")
def binding_ops():
    if hasattr(torch.ops, "sgrpo_npu") and hasattr(torch.ops.sgrpo_npu, "logits_stats"):
        return torch.ops.sgrpo_npu  # already loaded in this process
    files = sorted(p for p in CSRC.rglob("*") if p.suffix in {".h", ".cpp", ".sh"})
    h = hashlib.sha256(torch.__version__.encode())
    for f in files:
        h.update(f.read_bytes())
    out = Path(tempfile.gettempdir()) / "sgrpo_ascend_emu" / f"binding_{h.hexdigest()[:16]}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp.so")
        try:
            subprocess.run(["bash", str(CSRC / "scripts" / "check_binding_cpu.sh"), str(tmp)], check=True,
                           capture_output=True, text=True, timeout=600)
        except subprocess.CalledProcessError as exc:
            pytest.fail(f"binding build failed:\n{exc.stdout}\n{exc.stderr[-4000:]}")
        os.replace(tmp, out)
    torch.ops.load_library(str(out))
    return torch.ops.sgrpo_npu


def test_schemas(binding_ops):
    assert "Tensor(a!) state" in str(binding_ops.logits_stats.default._schema)
    assert "Tensor? grad_entropy" in str(binding_ops.logits_grad.default._schema)
    assert "Tensor(a!) logits" in str(binding_ops.logits_grad_.default._schema)


def test_argument_checks(binding_ops):
    y = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="dtype"):
        binding_ops.logits_stats(torch.randn(3, 5, dtype=torch.float64), y, torch.empty(0, 8), torch.empty(3),
                                 torch.empty(0), torch.empty(0), 0, 4, 1.0, IGNORE)
    with pytest.raises(RuntimeError, match="targets"):
        binding_ops.logits_stats(torch.randn(3, 5), y.int(), torch.empty(0, 8), torch.empty(3), torch.empty(0),
                                 torch.empty(0), 0, 4, 1.0, IGNORE)
    with pytest.raises(RuntimeError, match="state"):
        binding_ops.logits_stats(torch.randn(3, 5), y, torch.empty(3, 4), torch.empty(3), torch.empty(0),
                                 torch.empty(0), 0, 2, 1.0, IGNORE)
    with pytest.raises(RuntimeError, match=r"stats must be a contiguous \(2, 3\)"):  # (N,) is the old lse layout
        binding_ops.logits_stats(torch.randn(3, 5), y, torch.empty(0, 8), torch.empty(3), torch.empty(0),
                                 torch.empty(3), 0, npu.FINALIZE | npu.WRITE_STATS, 1.0, IGNORE)
    with pytest.raises(RuntimeError, match="stats"):
        binding_ops.logits_grad(torch.randn(3, 5), torch.empty(3, 5), y, torch.empty(3), None, torch.ones(3), None,
                                0, 1.0, IGNORE)


def test_meta_registration(binding_ops):
    x = torch.empty(4, 10, device="meta")
    binding_ops.logits_grad_(x, torch.empty(4, dtype=torch.int64, device="meta"), torch.empty(4, device="meta"), None,
                             torch.empty(4, device="meta"), None, 0, 1.0, IGNORE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_backend_through_binding(binding_ops, dtype):
    """npu_backend's real kernel path (torch.ops.sgrpo_npu.*) on CPU tensors vs float64 autograd."""
    n, v, d = 21, 700, 16
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(n, d, generator=g).to(dtype), (torch.randn(v, d, generator=g) / 2).to(dtype)
    y = torch.randint(0, v, (n,), generator=g)
    y[0] = IGNORE
    gl, gh = torch.randn(n, generator=g), torch.randn(n, generator=g)
    opts = Options(memory_budget=2000)
    with npu.use_kernels(npu._TorchNpuKernels()):
        logp, ent, stats = npu.linear_logprobs_fwd(h, w, y, None, opts)
        grad_h, grad_w, _ = npu.linear_logprobs_bwd(gl, gh, h, w, y, None, stats, ent, opts)
        logits = (h.float() @ w.float().t()).to(dtype)
        lp2, ent2, stats2 = npu.logprobs_from_logits_fwd(logits, y, Options(inplace_backward=True))
        g2 = npu.logprobs_from_logits_bwd(gl, gh, logits, y, stats2, ent2, Options(inplace_backward=True))
    assert g2.data_ptr() == logits.data_ptr()
    hh, ww = h.double().requires_grad_(), w.double().requires_grad_()
    ls = torch.log_softmax(hh @ ww.t(), -1)
    keep = y != IGNORE
    r_lp = torch.where(keep, ls.gather(1, y.clamp(min=0)[:, None]).squeeze(1), torch.zeros(n).double())
    r_ent = torch.where(keep, -(ls.exp() * ls).sum(-1), torch.zeros(n).double())
    r_gh, r_gw = torch.autograd.grad((gl.double() * r_lp).sum() + (gh.double() * r_ent).sum(), [hh, ww])
    tol = dict(rtol=3e-2, atol=3e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logp.double(), r_lp.detach(), **tol)
    torch.testing.assert_close(ent.double(), r_ent.detach(), **tol)
    torch.testing.assert_close(grad_h.double(), r_gh, **tol)
    torch.testing.assert_close(grad_w.double(), r_gw, **tol)
    torch.testing.assert_close(lp2.double(), r_lp.detach(), **tol)
