#!/usr/bin/env bash
# CI: the main suite and the three stages that need an install of their own.
#   bash .ci/stages.sh [COMMAND...]
# COMMAND (the README's: `env TRITON_INTERPRET=1 python -m pytest -q`, the main suite) runs first, while the wheel,
# verl and vLLM stages' venvs are made (or checked for reuse) in the background, at nice 10: their downloads go on
# whatever the suite does, and their unpacking takes only the CPU the suite leaves. A failing COMMAND stops everything
# with its exit status. Then each stage in turn (wheel, verl, vLLM) waits for its venv and runs its tests. Only the
# venvs' dependencies are installed in the background; the verl and vLLM stages install the checkout itself later,
# under a lock (.ci/venv.sh, install_checkout), since that build writes into the checkout's folder, and stage_wheel
# installs the wheel it builds from a copy. A failed background build fails this script with its log.
# Self-contained: runs from anywhere.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
logs=$(mktemp -d)
declare -A pids=()
# each background build in a process group of its own (setsid), so that stopping this script stops its pip too
trap 'for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || true; done; rm -rf "$logs"' EXIT
t0=$(date +%s)
# the machine, printed first and last (the last lines are what a CI summary keeps): plans for CI's time need it
machine="$(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(awk '/MemTotal/{printf "%.0f", $2/1048576}' /proc/meminfo) GiB"
echo "stages: on $machine"

for stage in wheel verl vllm; do
  setsid nice -n 10 bash "$repo/.ci/stage_$stage.sh" --venv-only > "$logs/$stage.log" 2>&1 &
  pids[$stage]=$!
done
if [ $# -gt 0 ]; then
  # the suite's 20 slowest tests are listed (pytest --durations) for the same reason
  PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} --durations=20" "$@" || { rc=$?; echo "stages: the main suite failed (exit $rc) after $(( $(date +%s) - t0 )) s on $machine"; exit $rc; }
  echo "stages: the main suite took $(( $(date +%s) - t0 )) s"
fi

for stage in wheel verl vllm; do
  if wait "${pids[$stage]}"; then
    cat "$logs/$stage.log"
  else
    echo "stages: making the $stage venv failed; its log:" >&2
    cat "$logs/$stage.log" >&2
    exit 1
  fi
  unset "pids[$stage]"
  echo "stages: the $stage venv ready at $(( $(date +%s) - t0 )) s"
  bash "$repo/.ci/stage_$stage.sh"
done
echo "stages: all passed in $(( $(date +%s) - t0 )) s on $machine"
