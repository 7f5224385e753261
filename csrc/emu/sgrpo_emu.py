"""ctypes driver of the AscendC kernels compiled with g++ against the CPU test double (csrc/emu/kernel_operator.h).

`build()` compiles csrc/ascend/*.cpp + sgrpo_emu_capi.cpp into a shared library cached under the temp dir (keyed by a
hash of the sources, so one compile serves a whole pytest session and later ones); `EmuKernels` exposes the two kernels
with the same call signature as the torch_npu binding (`torch.ops.sgrpo_npu.*`), on contiguous CPU tensors, so that
`sgrpo_kernels.backends.npu_backend` can run its whole orchestration on the CPU in tests.

This is a test double of limited fidelity: it checks indexing, tails, UB budget, 32 B alignment, queue discipline and
the numerics of the kernel code, not synchronisation, timing or the CANN compiler.

The kernel flags, dtype codes and tiling limits come from sgrpo_kernels.backends.npu_backend, the one Python copy of
csrc/ascend/sgrpo_tiling.h (tests/test_npu_constants.py keeps the two equal).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from sgrpo_kernels.backends.npu_backend import DTYPE_CODE, HAS_GRAD_ENTROPY, MAX_TILE, UB_BYTES

CSRC = Path(__file__).resolve().parents[1]
SOURCES = [
    CSRC / "emu" / "sgrpo_emu_capi.cpp",
    CSRC / "ascend" / "sgrpo_logits_stats.cpp",
    CSRC / "ascend" / "sgrpo_logits_grad.cpp",
]
HEADERS = [
    CSRC / "emu" / "kernel_operator.h",
    CSRC / "ascend" / "sgrpo_tiling.h",
    CSRC / "ascend" / "sgrpo_kernel_common.h",
    CSRC / "ascend" / "sgrpo_launch.h",
]


class EmuError(RuntimeError):
    """An AscendC emulator check failed (alignment, UB capacity, queue discipline, bounds, ...)."""


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++"))


def build(cache_dir: str | os.PathLike | None = None, opt: str = "-O1") -> Path:
    """Compile (once per source hash) and return the path of libsgrpo_emu.so."""
    cxx = compiler()
    if cxx is None:
        raise FileNotFoundError("no C++ compiler (g++) found")
    h = hashlib.sha256(opt.encode())
    for f in SOURCES + HEADERS:
        h.update(f.read_bytes())
    root = Path(cache_dir) if cache_dir else Path(tempfile.gettempdir()) / "sgrpo_ascend_emu"
    out = root / h.hexdigest()[:16] / "libsgrpo_emu.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    cmd = [cxx, "-std=c++17", opt, "-shared", "-fPIC", "-DSGRPO_EMU", f"-I{CSRC / 'emu'}", f"-I{CSRC / 'ascend'}"]
    cmd += [str(s) for s in SOURCES] + ["-o", str(tmp)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    os.replace(tmp, out)  # atomic: concurrent sessions never load a half-written library
    return out


_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_U32 = ctypes.c_uint32


def load(path: str | os.PathLike) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.sgrpo_emu_last_error.restype = ctypes.c_char_p
    lib.sgrpo_emu_tiling.argtypes = [_I64, _I64, _U32, _U32, ctypes.c_int32, _U32, _U32, ctypes.POINTER(_U32)]
    lib.sgrpo_emu_tiling.restype = None
    lib.sgrpo_emu_logits_stats.argtypes = [_U32, ctypes.c_int32] + [_P] * 6 + [_I64] * 6 + [ctypes.c_float, _I64]
    lib.sgrpo_emu_logits_stats.restype = ctypes.c_int
    lib.sgrpo_emu_logits_grad.argtypes = [_U32, ctypes.c_int32] + [_P] * 7 + [_I64] * 7 + [ctypes.c_float, _I64]
    lib.sgrpo_emu_logits_grad.restype = ctypes.c_int
    return lib


def _ptr(t: torch.Tensor | None) -> int | None:
    if t is None or t.numel() == 0:
        return None
    assert t.device.type == "cpu", "the emulated kernels run on CPU tensors"
    return t.data_ptr()


class EmuKernels:
    """The kernel ops of the npu backend, run by the CPU emulation.

    cores: AIV cores to split rows over (a 910B has 40-48); ub_budget / max_tile: shrink the tiling to force many tiles
    and tails on small test shapes.
    """

    def __init__(self, lib: ctypes.CDLL, cores: int = 8, ub_budget: int = UB_BYTES, max_tile: int = MAX_TILE):
        self.lib = lib
        self.num_cores = cores
        self.ub_budget = ub_budget
        self.max_tile = max_tile
        self.launches: list[dict] = []

    def tiling(self, n_rows: int, vocab: int, elem_bytes: int, grad: bool) -> dict:
        out = (_U32 * 5)()
        self.lib.sgrpo_emu_tiling(n_rows, vocab, elem_bytes, self.num_cores, int(grad), self.ub_budget, self.max_tile,
                                  out)
        t = dict(zip(("block_dim", "tile", "n_tiles", "tail", "ub_bytes"), list(out)))
        if t["tile"] == 0:
            raise ValueError(f"no UB tiling fits: vocab={vocab} elem_bytes={elem_bytes} budget={self.ub_budget}")
        return t

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise EmuError(self.lib.sgrpo_emu_last_error().decode() or f"launcher returned {rc}")

    def logits_stats(self, logits: torch.Tensor, targets: torch.Tensor, state: torch.Tensor, logp: torch.Tensor,
                     entropy: torch.Tensor, stats: torch.Tensor, v0: int, flags: int, inv_tau: float,
                     ignore_index: int) -> None:
        n, v = logits.shape
        assert logits.stride(1) == 1 and targets.dtype == torch.int64 and targets.is_contiguous()
        assert stats.numel() == 0 or (stats.shape == (2, n) and stats.is_contiguous()), "stats: contiguous (2, N)"
        t = self.tiling(n, v, logits.element_size(), grad=False)
        self.launches.append({"kernel": "logits_stats", **t})
        self._check(self.lib.sgrpo_emu_logits_stats(
            t["block_dim"], DTYPE_CODE[logits.dtype], _ptr(logits), _ptr(targets), _ptr(state), _ptr(logp),
            _ptr(entropy), _ptr(stats), n, logits.stride(0), v, v0, t["tile"], flags, inv_tau, ignore_index))

    def logits_grad(self, logits: torch.Tensor, out: torch.Tensor, targets: torch.Tensor, stats: torch.Tensor,
                    entropy: torch.Tensor | None, grad_logp: torch.Tensor, grad_entropy: torch.Tensor | None,
                    v0: int, inv_tau: float, ignore_index: int) -> None:
        n, v = logits.shape
        assert logits.stride(1) == 1 and out.stride(1) == 1 and out.dtype == logits.dtype
        assert stats.shape == (2, n) and stats.is_contiguous(), "stats: contiguous (2, N)"
        flags = HAS_GRAD_ENTROPY if grad_entropy is not None else 0
        t = self.tiling(n, v, logits.element_size(), grad=True)
        self.launches.append({"kernel": "logits_grad", **t})
        self._check(self.lib.sgrpo_emu_logits_grad(
            t["block_dim"], DTYPE_CODE[logits.dtype], _ptr(logits), _ptr(out), _ptr(targets), _ptr(stats),
            _ptr(entropy), _ptr(grad_logp), _ptr(grad_entropy), n, logits.stride(0), out.stride(0), v, v0, t["tile"],
            flags, inv_tau, ignore_index))
