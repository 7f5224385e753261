"""The trainer's behaviour fingerprint: tiny-model runs of `python -m train` over every preset and every optional
feature, each reduced to hashes of what it wrote (step and eval records without their timing fields, the summary
without its wall time, the held-out answers, the final weights). A refactor that claims "no behaviour change" must
leave every hash as it was, on the same machine.

    python -m benchmarks.fingerprint --out /tmp/fp-before.json            # on the old commit
    python -m benchmarks.fingerprint --out /tmp/fp-after.json --check /tmp/fp-before.json

`--check` prints each case whose hashes differ (and which file) and exits 1 if any does. `--added-keys a,b`: record
keys added since the compared fingerprint are left out of this run's hashes (what they hold is tested elsewhere).
`--cases a,b` runs a subset; `--list` names the cases. `--out` and `--check` are checked before any case runs
(exit 2, one line). Runs go through the public command line only, so the same
script checks any layout of train/. About 15 s a case on one core (two cases run at a time by default)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMING = {"tokens_per_s", "gen_s", "step_s", "sync_s", "peak_mem_mb", "train_peak_mem_mb", "wall_s", "output_dir"}
BASE = [
    "--model", "tiny", "--max-steps", "3", "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "6",
    "--eval-problems", "6", "--eval-k", "2", "--eval-k-problems", "3", "--probe-size", "3", "--kl-every", "1",
    "--warmup-steps", "1", "--lr", "1e-3", "--threads", "1", "--progress", "false", "--save-model", "true",
]  # fmt: skip
REWARD = ["--reward", "benchmarks.fingerprint_rewards:char_reward"]
PRESETS = ["s_grpo", "gtpo", "gtpo_official", "grpo", "dr_grpo", "dapo", "gspo", "grpo_ef", "grpo_tc", "lite_ppo",
           "s_grpo_afn", "dppo_tv", "dppo_kl", "cispo", "sapo", "gmpo", "clip_cov", "kl_cov"]  # fmt: skip
FEATURES = {
    "grpo_nokl": ["--preset", "grpo", "--loss", "beta=0"],  # the preset has the reference (beta 0.04)
    "ppo_epochs": ["--preset", "grpo", "--ppo-epochs", "2"],
    "dynamic_sampling": ["--preset", "grpo", "--dynamic-sampling", "true"],
    "trust_region": ["--preset", "grpo", "--trust-region", "0.01"],
    "grad_penalty": ["--preset", "grpo", "--grad-penalty", "0.1"],
    "log_mechanism": ["--preset", "grpo", "--log-mechanism", "true"],
    "mechanism_tr_s_grpo": ["--preset", "s_grpo", "--log-mechanism", "true", "--trust-region", "0.01"],
    "lora": ["--preset", "grpo", "--lora", "true"],
    "train_layers": ["--preset", "grpo", "--train-layers", "1"],
    "format_reward": ["--preset", "grpo", "--format-reward-weight", "0.5"],
    "seed1": ["--preset", "grpo", "--seed", "1"],
}
NO_USER_REWARD = {"dense_reward": ["--preset", "grpo", "--dense-reward", "gt_likelihood"]}


def cases() -> dict[str, list[str]]:
    out = {f"preset_{p}": ["--preset", p, *REWARD] for p in PRESETS}
    out |= {name: [*flags, *REWARD] for name, flags in FEATURES.items()}
    return out | NO_USER_REWARD


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


ADDED: set[str] = set()  # --added-keys


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in TIMING and k not in ADDED}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _weights(model_dir: Path) -> str:
    from safetensors.numpy import load_file  # numpy: no torch import in this process

    h = hashlib.sha256()
    for f in sorted(model_dir.glob("*.safetensors")):
        tensors = load_file(str(f))
        for name in sorted(tensors):
            h.update(name.encode())
            h.update(tensors[name].tobytes())
    return h.hexdigest()[:16]


def run_case(name: str, flags: list[str], scratch: Path) -> dict:
    out = scratch / name
    cmd = [sys.executable, "-m", "train", *BASE, *flags, "--output-dir", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}
    records = [_strip(json.loads(line)) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {
        "steps": _digest([r for r in records if r.get("event") != "eval"]),
        "evals": _digest([r for r in records if r.get("event") == "eval"]),
        "summary": _digest(_strip(json.loads((out / "summary.json").read_text()))),
        "heldout": _digest((out / "heldout.jsonl").read_text()) if (out / "heldout.jsonl").exists() else None,
        "weights": _weights(out / "model"),
        "n_steps": sum(r.get("event") != "eval" for r in records),
    }


def _jobs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {n}")
    return n


def _out_error(out: str) -> str | None:
    """Why the fingerprint could not be written to `out` (None when it can): checked before any case runs."""
    path = Path(out)
    if path.is_dir() or (path.exists() and not os.access(path, os.W_OK)):
        return f"--out {out}: not a writable file"
    if not path.parent.is_dir() or not os.access(path.parent, os.W_OK):
        return f"--out {out}: {path.parent} is not a writable directory"
    return None


def _read_check(check: str) -> tuple[dict | None, str | None]:
    """The earlier fingerprint `check`, or why it cannot be compared with: read before any case runs."""
    try:
        ref = json.loads(Path(check).read_text())
    except OSError as exc:
        return None, f"--check {check}: cannot be read ({exc.strerror or exc})"
    except ValueError as exc:  # not UTF-8, not JSON
        return None, f"--check {check}: not JSON ({exc})"
    if not isinstance(ref, dict) or not all(isinstance(v, dict) for v in ref.values()):
        return None, f"--check {check}: not a fingerprint (a JSON object of cases)"
    return ref, None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=False, help="write the fingerprint JSON here")
    ap.add_argument("--check", help="compare with this earlier fingerprint JSON; exit 1 on any difference")
    ap.add_argument("--cases", help="comma-separated subset (default: all)")
    ap.add_argument("--jobs", type=_jobs, default=2, help="cases run at a time, at least 1 [default: 2]")
    ap.add_argument("--list", action="store_true", help="name the cases and exit")
    ap.add_argument("--added-keys", default="", help="record keys added since --check's fingerprint: left out")
    args = ap.parse_args(argv)
    ADDED.update(k for k in args.added_keys.split(",") if k)
    todo = cases()
    if args.list:
        print("\n".join(todo))
        return 0
    if args.cases is not None:
        if not args.cases.strip(","):
            ap.error("--cases: empty; name at least one case (--list names them), or leave it out to run all")
        unknown = sorted(set(args.cases.split(",")) - set(todo))
        if unknown:
            ap.error(f"--cases: unknown {unknown}; known: {', '.join(todo)}")
        todo = {k: todo[k] for k in args.cases.split(",")}
    ref, check_error = _read_check(args.check) if args.check is not None else (None, None)
    errors = [e for e in (args.out is not None and _out_error(args.out), check_error) if e]
    if errors:  # before anything runs: a run's results are never lost to a bad path
        print(f"{ap.prog}: error: {'; '.join(errors)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        futures = {k: pool.submit(run_case, k, v, Path(tmp)) for k, v in todo.items()}
        result = {}
        for k, fut in futures.items():
            result[k] = fut.result()
            print(f"{k:24s} {result[k]}", file=sys.stderr, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    bad = [k for k, v in result.items() if "error" in v]
    if args.check:
        for k, v in result.items():
            if k not in ref:
                print(f"NEW   {k} (not in {args.check})")
            elif v != ref[k]:
                diff = [f for f in v if v.get(f) != ref[k].get(f)]
                print(f"DIFF  {k}: {', '.join(diff)}")
                bad.append(k)
        print(f"{len(result) - len(set(bad))} of {len(result)} cases identical to {args.check}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
