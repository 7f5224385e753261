"""The machine a run or a benchmark ran on, as its records state it: the CPU's name, family and model, and the vector
instruction sets that decide which kernels run (and so the last bits of every float, and the speed): two "AMD EPYC"
machines with and without AVX-512 / bf16 instructions give different numbers and timings."""

from __future__ import annotations

import platform
from pathlib import Path

ISA = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "neon", "sve")  # the flags worth naming, in /proc/cpuinfo's words


def cpu_info(cpuinfo: str | None = None) -> dict:
    """{"cpu": model name, "family", "model" (x86; None elsewhere), "isa": the flags of ISA this CPU has}, from
    `cpuinfo` (the text of /proc/cpuinfo; read when None, empty where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:  # the first processor's entry
            fields[key.strip()] = value.strip()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {
        "cpu": fields.get("model name") or platform.processor() or "cpu",
        "family": fields.get("cpu family"),
        "model": fields.get("model"),
        "isa": [f for f in ISA if f in flags],
    }


def cpu_label() -> str:
    """One line: 'AMD EPYC (family 25 model 17; avx2 avx512f avx512_bf16)'."""
    info = cpu_info()
    where = f"family {info['family']} model {info['model']}; " if info["family"] else ""
    return f"{info['cpu']} ({where}{' '.join(info['isa']) or 'no vector ISA named'})"


def bf16_support(device) -> tuple[bool, str]:
    """(whether `device` computes bf16 natively, why in words): a CUDA GPU that says so, a CPU with AVX512-BF16 or
    AMX (elsewhere bf16 is emulated, several times slower: docs/rollouts.md)."""
    if device.type == "cuda":
        import torch

        native = torch.cuda.is_bf16_supported()
        return native, "this GPU computes bf16" if native else "this GPU has no bf16"
    if device.type != "cpu":
        return True, f"device {device.type}"
    native = [f for f in cpu_info()["isa"] if f in ("avx512_bf16", "amx_bf16")]
    if native:
        return True, f"this CPU computes bf16 natively ({', '.join(native)})"
    return False, "this CPU has no bf16 instructions (bf16 would be emulated, several times slower)"
