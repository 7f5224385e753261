#!/usr/bin/env bash
# CI stage: the verl plugin (issue 27; docs/verl.md). verl 0.9.1 pins transformers < 5.11, so it gets a venv of its own at
# ${SGRPO_CI_VENVS:-/tmp/sgrpo-ci-venvs}/verl: torch==2.13.0 first (the local CPU wheel; a looser spec would pull a CUDA
# build), then the checkout with the [verl,test] extras (non-editable: the entry point is what a user's install gets).
# A venv left by an earlier run is reused when it is complete (its marker file names the same requirements and
# `import verl` works), and only the checkout is reinstalled. Runs tests/test_integrations_verl*.py with the verl tests
# required to run (SGRPO_REQUIRE_VERL=1: a missing or broken verl fails the stage instead of skipping).
# Self-contained: `bash .ci/stage_verl.sh` from anywhere.
set -euo pipefail
t0=$(date +%s)
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${SGRPO_CI_VENVS:-/tmp/sgrpo-ci-venvs}/verl
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
source "$repo/.ci/venv.sh"

want=$(wanted "$repo/pyproject.toml" verl test)
if reusable "$venv" "$want" verl; then
  echo "stage_verl: reusing the venv at $venv"
  "$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$repo" 2> >(quiet)  # this checkout
else
  echo "stage_verl: installing verl into a fresh venv at $venv"
  rm -rf "$venv"
  python -m venv "$venv"
  "$venv/bin/python" -m pip install -q torch==2.13.0 2> >(quiet)
  "$venv/bin/python" -m pip install -q "$repo[verl,test]" 2> >(quiet)
  "$venv/bin/python" -c "import verl; print('stage_verl: verl', verl.__version__)"
  completed "$venv" "$want"
fi
t1=$(date +%s)
echo "stage_verl: venv ready in $(( t1 - t0 )) s"

cd "$repo"
SGRPO_REQUIRE_VERL=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_integrations_verl.py \
  tests/test_integrations_verl_worker.py
echo "stage_verl: passed in $(( $(date +%s) - t0 )) s (venv $(( t1 - t0 )) s, tests $(( $(date +%s) - t1 )) s)"
