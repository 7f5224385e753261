#!/usr/bin/env bash
# The Triton backend's GPU checks and benchmark, in as few calls as a short GPU lease allows. From the repository root
# on a CUDA machine (no network needed; the package is pure Python and is used from the checkout):
#
#   bash benchmarks/gpu_session.sh tests   # gpu-marked tests, then the op suites on CUDA           -> pytest_*.log
#   bash benchmarks/gpu_session.sh bench   # benchmarks.bench_gpu (both issue shapes, 3 modes) -> gpu.{csv,md,png},
#                                          # then benchmarks.profile_gpu's kernel breakdowns (fwd, fwd+bwd, 50% zero)
#                                          # -> profile.log
#   bash benchmarks/gpu_session.sh all     # the gpu-marked tests, the benchmark, the op suites, the profile
#
# Output goes to $OUT when it is set (the device tool's return folder, 8 files at most: `all` writes 8), else
# benchmarks/results/; env.txt there collects the versions and each step's exit status and seconds.
# A short lease: each step can be given a wall-clock limit in seconds (GPU_LIMIT_<step>=S, steps pytest_gpu, bench_gpu,
# pytest_cuda, profile; a step cut off exits 124 and the next one runs); BENCH_GPU_ARGS is added to bench_gpu's command
# line (e.g. "--repeats 10 --warmup 3"). Peers (Liger-Kernel, cut-cross-entropy; Liger's sm_90 scaled CE also needs
# nvidia-cutlass-dsl and its libraries, whose CUDA 13 wheel is 92 MB) are installed from wheels in .wheels/ when that
# folder exists, into a folder of their own added to PYTHONPATH after the checkout (the machine's packages stay as
# they are):
#   pip download --no-deps -d .wheels liger-kernel==0.8.5 cut-cross-entropy==25.1.1
# A step that fails does not stop the next one; the script exits non-zero if any failed. The pytest steps run on 8
# workers when pytest-xdist is there (the kernels compile in parallel).
# Measured on an H200 (2026-11-28, benchmarks/results/gpu.md): pytest_gpu 69 s and pytest_cuda 99 s on 8 workers,
# bench_gpu 175 s with --repeats 10 --warmup 3, one profile ~25 s; a machine's start ~40 s. `all` fits a 15-minute
# lease with time for one rerun.
set -uo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
case "$what" in tests|bench|all) ;; *) echo "usage: $0 tests|bench|all" >&2; exit 2 ;; esac
out=${OUT:-benchmarks/results}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # sgrpo_kernels, and benchmarks.* for `-m`
unset TRITON_INTERPRET  # the real kernels, on the GPU
status=0
if ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_session.sh: $py sees no CUDA device; nothing to run here (the CPU suite is the README's test command)" >&2
  exit 2
fi

if compgen -G ".wheels/*.whl" >/dev/null; then
  site=$(mktemp -d)
  if "$py" -m pip install -q --no-deps --no-index --no-compile --target "$site" .wheels/*.whl; then
    export PYTHONPATH="$PYTHONPATH:$site"  # after the checkout: the peers, never a second copy of the machine's own
  else
    echo "warning: peer wheels did not install" >&2
  fi
fi

{
  echo "== $(date -u +%FT%TZ) gpu_session.sh $what, git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1
  "$py" - <<'EOF'
import importlib.metadata as md
import torch
print("python", __import__("sys").version.split()[0], "| cuda", torch.version.cuda, "|", torch.cuda.get_device_name(0),
      "sm_%d%d" % torch.cuda.get_device_capability(0))
for name in ("torch", "triton", "numpy", "hypothesis", "liger-kernel", "cut-cross-entropy", "nvidia-cutlass-dsl"):
    try:
        print(f"  {name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"  {name} (not installed)")
EOF
} >>"$out/env.txt" 2>&1
tail -n 12 "$out/env.txt"

xdist=()
if "$py" -c "import xdist" 2>/dev/null && [[ " ${PYTEST_ADDOPTS:-} " != *" -n "* ]]; then
  xdist=(-n 8)
fi

step() {  # step NAME CMD...: run (within GPU_LIMIT_NAME seconds when set), tee the log, remember a failure
  local name=$1; shift
  local limit_var="GPU_LIMIT_$name"
  local limit=${!limit_var:-0}
  echo "== $name: $* (limit ${limit}s, 0 = none)"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.log" | tail -n 25
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$out/env.txt"
  [ "$rc" -eq 0 ] || status=1
}

if [ "$what" != bench ]; then
  # the tests that only run on a GPU: real shapes (D=4096, V=131072 / 151936, bf16) vs float64 on sampled rows,
  # determinism, zero-gradient skipping == dense, 1M rows; the first (fixed) config of each kernel: the benchmark
  # autotunes, and its gate checks whichever config wins against float64 at its shapes.
  step pytest_gpu env SGRPO_TRITON_AUTOTUNE=0 "$py" -m pytest -q "${xdist[@]}" -m gpu -p no:cacheprovider \
    tests/test_triton_backend.py
fi
if [ "$what" != tests ]; then
  # shellcheck disable=SC2086  # BENCH_GPU_ARGS is split into words on purpose
  step bench_gpu "$py" -m benchmarks.bench_gpu --out "$out/gpu" ${BENCH_GPU_ARGS:-}
fi
if [ "$what" != bench ]; then
  # the shared op suites (forward, every gradient, bad inputs; the sampler's support) with their cuda-torch /
  # cuda-triton parametrizations; their many small hypothesis shapes would each autotune (compile + time every
  # config): fixed configs instead. pytest-timeout's limit per test keeps one stuck case from eating the lease.
  step pytest_cuda env SGRPO_TRITON_AUTOTUNE=0 "$py" -m pytest -q "${xdist[@]}" -p no:cacheprovider -k cuda \
    --timeout 120 tests/test_ops.py tests/test_ops_contract.py tests/test_ops_truncated.py
fi
if [ "$what" != tests ]; then
  # kernel-by-kernel breakdown at the issue's H100 target shape, dense and with half the rows at zero gradient
  tmp=$(mktemp -d)
  step profile bash -c "'$py' -m benchmarks.profile_gpu --out '$tmp/dense.md' && \
    '$py' -m benchmarks.profile_gpu --zero-frac 0.5 --out '$tmp/zero50.md' && \
    '$py' -m benchmarks.profile_gpu --mode fwd --out '$tmp/fwd.md'"
fi
exit $status
