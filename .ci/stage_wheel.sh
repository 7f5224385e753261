#!/usr/bin/env bash
# CI stage: the trainer as a user installs it. Builds the wheel from a copy of the checkout, installs it with the
# [train] extra into its own venv (${SGRPO_CI_VENVS:-/tmp/sgrpo-ci-venvs}/wheel: torch==2.13.0 first, the CPU wheel,
# then the project's and the [train] extra's requirements, as pyproject.toml declares them; reused when complete, as
# the other stages' venvs, with any sgrpo-kernels in it uninstalled first, so pip resolves the new wheel's own
# requirements against it), then, from a directory outside the checkout (so nothing can come from the repository's
# files): the wheel holds no top-level `train`, `sgrpo-train --help`, a one-step run of the tiny model that writes
# OUTPUT_DIR/model/ and loads it back with from_pretrained, `sgrpo-train --config` of that run's config.json,
# `sgrpo-study --help` and `sgrpo-bench --help`, and `sgrpo-bench cpu` and `ddp` (their worker processes must find the
# installed packages). Self-contained: `bash .ci/stage_wheel.sh` from anywhere; `--venv-only` makes (or reuses) the
# venv and stops there (.ci/stages.sh: the venv beside the main suite, the stage after it).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
source "$repo/.ci/venv.sh"
stage_start wheel
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mapfile -t reqs < <(requirements "$repo/pyproject.toml" train)  # what `pip install "WHEEL[train]"` pulls
want=$(printf '%s;' "${reqs[@]}")
if reusable "$venv" "$want" transformers; then
  echo "stage_wheel: reusing the venv at $venv"
else
  fresh_venv "the wheel's requirements"
  "$venv/bin/python" -m pip install -q "${reqs[@]}" 2> >(quiet)
  completed "$venv" "$want"
fi
venv_ready
[ "${1:-}" = --venv-only ] && exit 0

echo "stage_wheel: building the wheel"
# a copy of the tracked (and new, not ignored) files: building in the checkout would leave build/ and *.egg-info there
(cd "$repo" && git ls-files -co --exclude-standard -z | python -c 'import os, sys  # tracked files deleted here skipped
sys.stdout.buffer.write(b"".join(p + b"\0" for p in sys.stdin.buffer.read().split(b"\0") if p and os.path.lexists(p)))' \
  | tar --null -T - -cf -) | tar -xf - -C "$work" --one-top-level=src
python -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
wheel=$(ls "$work"/dist/sgrpo_kernels-*.whl)
files=$(python -c 'import sys, zipfile; print("\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))' "$wheel")
if grep -qE '^(train|benchmarks)/' <<<"$files"; then
  echo "stage_wheel: the wheel installs a generic top-level package (train/ or benchmarks/)" >&2
  exit 1
fi
for f in sgrpo_train/data/gsm8k_sample.jsonl sgrpo_sandbox/boot.py sgrpo_sandbox/jail.py \
    sgrpo_sandbox/protocol.py; do
  grep -qx "$f" <<<"$files" || { echo "stage_wheel: $f is not in the wheel" >&2; exit 1; }
done

echo "stage_wheel: built at $(( $(date +%s) - t0 )) s; installing it into $venv"
"$venv/bin/python" -m pip uninstall -q -y sgrpo-kernels 2>/dev/null || true  # a reused venv's earlier wheel
# torch==2.13.0 pinned again: with it installed, pip keeps the local CPU wheel (a looser spec could pull a CUDA build)
"$venv/bin/python" -m pip install -q torch==2.13.0 "$wheel[train]" 2> >(quiet)

echo "stage_wheel: installed at $(( $(date +%s) - t0 )) s"
cd "$work"  # outside the checkout
export PATH="$venv/bin:$PATH"
sgrpo-train --help > help.txt && head -n 1 help.txt
sgrpo-train --model tiny --max-steps 1 --prompts-per-step 2 --group-size 2 --max-new-tokens 4 --eval-problems 4 \
  --eval-k 2 --probe-size 2 --threads 1 --progress false --output-dir "$work/run"
"$venv/bin/python" - "$work/run" <<'EOF'
import json, sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

run = Path(sys.argv[1])
assert json.loads((run / "summary.json").read_text())["steps"] == 1
model = AutoModelForCausalLM.from_pretrained(run / "model")
trained = torch.load(run / "checkpoint" / "state.pt", weights_only=True)["trainable"]
weights = model.state_dict()
assert trained and all(torch.equal(weights[name], t) for name, t in trained.items()), "model/ is not the trained policy"
import sgrpo_train
from sgrpo_train.sandbox import FunctionCheck, Limits, run_check  # the trainer's re-export of sgrpo_sandbox

assert "site-packages" in sgrpo_train.__file__, sgrpo_train.__file__  # the installed trainer, not a checkout's
test = "def check(c):\n    assert c(1) == 2\n"  # the sandbox finds its bootstrap files beside the installed ones
assert run_check(FunctionCheck("def f(x):\n    return x + 1\n", test, "f"), Limits()).passed
assert not run_check(FunctionCheck("def f(x):\n    return x\n", test, "f"), Limits()).passed
print(f"stage_wheel: {run / 'model'} loads; its weights are the checkpoint's")
EOF
sgrpo-train --config "$work/run/config.json" --max-steps 0 --output-dir "$work/rerun" --eval-problems 2 --eval-k 0
sgrpo-study --help > help.txt && head -n 1 help.txt
sgrpo-bench --help > help.txt && head -n 1 help.txt
# the benchmarks start their workers (and the trainer) as subprocesses: they must find the installed packages
sgrpo-bench cpu --models smollm2-135m --tokens 32 --modes fwd --repeats 1 --warmup 0 --out "$work/bench/cpu"
sgrpo-bench ddp --model tiny --steps 1 --prompts 2 --group-size 2 --eval-problems 2 --cores 2
test -f "$work/runs/bench/ddp/ddp.md" && test -f "$work/bench/cpu.md"
stage_passed
