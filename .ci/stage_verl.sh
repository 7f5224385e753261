#!/usr/bin/env bash
# CI stage: the verl plugin (issue 27; docs/verl.md). verl 0.9.1 pins transformers < 5.11, so it gets a venv of its own at
# ${SGRPO_CI_VENVS:-/tmp/sgrpo-ci-venvs}/verl: torch==2.13.0 first (the local CPU wheel; a looser spec would pull a CUDA
# build), then the checkout with the [verl,test] extras (non-editable: the entry point is what a user's install gets).
# A venv left by an earlier run is reused when it is complete (its marker file names the same requirements and
# `import verl` works), and only the checkout is reinstalled. Runs tests/test_integrations_verl*.py with the verl tests
# required to run (SGRPO_REQUIRE_VERL=1: a missing or broken verl fails the stage instead of skipping).
# Self-contained: `bash .ci/stage_verl.sh` from anywhere; `--venv-only` makes (or reuses) the venv and stops there.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
source "$repo/.ci/venv.sh"
stage_start verl

want=$(wanted "$repo/pyproject.toml" verl test)
if reusable "$venv" "$want" verl; then
  echo "stage_verl: reusing the venv at $venv"
else
  fresh_venv verl
  mapfile -t reqs < <(requirements "$repo/pyproject.toml" verl test)
  "$venv/bin/python" -m pip install -q "${reqs[@]}" 2> >(quiet)  # what `pip install ".[verl,test]"` pulls
  "$venv/bin/python" -c "import verl; print('stage_verl: verl', verl.__version__)"
  completed "$venv" "$want"
fi
venv_ready
[ "${1:-}" = --venv-only ] && exit 0  # .ci/stages.sh: the venv now (beside the other stages'), the tests later
install_checkout --force-reinstall "$repo"  # this checkout (not editable: the entry point a user's install gets)

cd "$repo"
SGRPO_REQUIRE_VERL=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_integrations_verl.py \
  tests/test_integrations_verl_docs.py \
  tests/test_integrations_verl_worker.py
stage_passed
