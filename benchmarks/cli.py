"""`sgrpo-bench SCRIPT [ARGS ...]`: the benchmark scripts behind one command, for an installed wheel (where the
benchmarks are the package `sgrpo_bench` and the trainer is `sgrpo_train`). From a checkout, `python -m benchmarks.X`
is the same thing.

The scripts import each other as `benchmarks.common` and the trainer as `train.*` (their names in the repository).
Installed, this command makes those names (and `study`) point at the installed packages for its own process only (an
entry in `sys.modules`), so nothing named `benchmarks` or `train` is installed and no other process sees them. Results
go where each script writes them (`--out`, or the scratch default the script's `--help` names)."""

from __future__ import annotations

import importlib
import importlib.util
import sys

SCRIPTS = {
    "cpu": ("bench_cpu", "the LM-head ops on CPU (torch chunked vs naive)"),
    "gpu": ("bench_gpu", "the LM-head ops on CUDA against the peer kernels"),
    "trainers": ("bench_trainers", "the bundled trainer against TRL on the same job"),
    "rollout": ("bench_rollout", "the rollout engines: HF generate, vLLM fp32 and bf16"),
    "ddp": ("bench_ddp", "the trainer's torchrun data parallelism"),
    "profile": ("profile_gpu", "a torch.profiler trace of the CUDA ops"),
    "memory": ("memory_on_paper", "model-state bytes with and without a reference model, 135M / 1.5B / 7B"),
    "task": ("study_task", "a study regime's task: held-out set, base accuracy, completion length and entropy"),
    "truncated": ("bench_truncated", "the truncated-support log-probs (top_k / top_p / min_p) on CPU"),
    "sampler-bias": ("bench_sampler_bias", "vLLM's sampler against the trainer's truncated log-probs (needs vllm)"),
}


def _alias(repo_name: str, installed: str) -> None:
    """Let `import repo_name.x` find the installed package `installed` (this process only)."""
    if repo_name not in sys.modules and importlib.util.find_spec(repo_name) is None:
        sys.modules[repo_name] = importlib.import_module(installed)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SCRIPTS:
        lines = "\n".join(f"  {name:<9} {about} (benchmarks/{mod}.py)" for name, (mod, about) in SCRIPTS.items())
        text = f"usage: sgrpo-bench SCRIPT [ARGS ...]   (SCRIPT --help for its options)\n\nscripts:\n{lines}"
        if argv and argv[0] not in ("-h", "--help"):
            print(f"sgrpo-bench: unknown script {argv[0]!r}; expected one of {', '.join(SCRIPTS)}\n\n{text}",
                  file=sys.stderr)  # fmt: skip
            return 2
        print(text)
        return 0
    package = __package__ or "benchmarks"
    trainer = "train" if package == "benchmarks" else "sgrpo_train"
    _alias("benchmarks", package)
    _alias("train", trainer)
    _alias("study", "study" if package == "benchmarks" else "sgrpo_study")  # (study_task reads the study's regimes)
    importlib.import_module("benchmarks.common").LAUNCHED_AS = f"sgrpo-bench {argv[0]}"  # usage lines say so
    module = importlib.import_module(f"benchmarks.{SCRIPTS[argv[0]][0]}")
    result = module.main(argv[1:])
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
