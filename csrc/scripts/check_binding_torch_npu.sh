#!/usr/bin/env bash
# Syntax-check csrc/ascend/sgrpo_binding.cpp against the REAL torch + torch_npu headers without an NPU or CANN.
# Downloads the wheels with --no-deps into a scratch dir (never installs them), unpacks only their include trees and
# compiles with -fsyntax-only, C++20 (torch_npu 2.14 needs it). CANN's platform header is not in any wheel: the stub
# from csrc/tests/stubs stands in for tiling/platform/platform_ascendc.h (acl/acl.h comes from torch_npu's wheel).
# Not run by the test suite (downloads ~600 MB); usage: csrc/scripts/check_binding_torch_npu.sh [TORCH_NPU_VERSION]
set -euo pipefail
ver=${1:-2.14.0}
here=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-/tmp/sgrpo_torch_npu_headers}
mkdir -p "$work" && cd "$work"
pip download --no-deps --only-binary=:all: "torch_npu==$ver" -d wheels
# PyPI's torch wheel carries the same headers as the CPU index's; only the include trees are unpacked
pip download --no-deps --only-binary=:all: "torch==$ver" -d wheels
rm -rf unpacked && mkdir unpacked
unzip -q -o wheels/torch-"$ver"-*.whl 'torch/include/*' -d unpacked
unzip -q -o wheels/torch_npu-"$ver"-*.whl 'torch_npu/include/*' -d unpacked
tinc=unpacked/torch/include
ninc=unpacked/torch_npu/include
acl=$(dirname "$(dirname "$(find "$ninc" -path '*acl/acl.h' | head -1)")")
mkdir -p stubs/tiling/platform
cp "$here/tests/stubs/tiling/platform/platform_ascendc.h" stubs/tiling/platform/
${CXX:-g++} -std=c++20 -fsyntax-only -D_GLIBCXX_USE_CXX11_ABI=1 -I"$here/ascend" -Istubs -I"$acl" -isystem "$tinc" \
  -isystem "$tinc/torch/csrc/api/include" -isystem "$ninc" -isystem "$(dirname "$ninc")" "$here/ascend/sgrpo_binding.cpp"
echo "sgrpo_binding.cpp compiles against torch_npu $ver headers"
