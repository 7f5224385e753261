#!/usr/bin/env bash
# CI: the three stages that need an install of their own, after the main suite. The verl and vLLM venvs are made (or
# checked for reuse) in the background while stage_wheel runs: each install is one pip process, which uses one core, so
# side by side they take about as long as the longest of them instead of the sum. Then the verl and vLLM stages run
# their tests, one after the other. Only the venvs' dependencies are installed side by side; each stage installs the
# checkout itself under a lock (.ci/venv.sh, install_checkout), since that build writes into the checkout's folder.
# A failed background build fails this script with its log. Self-contained: `bash .ci/stages.sh` from anywhere.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
logs=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$logs"' EXIT

for stage in verl vllm; do
  bash "$repo/.ci/stage_$stage.sh" --venv-only > "$logs/$stage.log" 2>&1 &
  pids+=($!)
done
bash "$repo/.ci/stage_wheel.sh"

for i in 0 1; do
  stage=$([ "$i" = 0 ] && echo verl || echo vllm)
  if wait "${pids[$i]}"; then
    cat "$logs/$stage.log"
  else
    echo "stages: making the $stage venv failed; its log:" >&2
    cat "$logs/$stage.log" >&2
    exit 1
  fi
done
pids=()
bash "$repo/.ci/stage_verl.sh"
bash "$repo/.ci/stage_vllm.sh"
