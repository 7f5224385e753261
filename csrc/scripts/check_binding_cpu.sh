#!/usr/bin/env bash
# Compile csrc/ascend/sgrpo_binding.cpp against the local (CPU) torch with stub torch_npu/CANN headers
# (csrc/tests/stubs) and link it with the CPU-emulated kernels, registering the ops for CPU too
# (-DSGRPO_BINDING_CPU_TEST). The result loads with torch.ops.load_library and runs torch.ops.sgrpo_npu.* on CPU
# tensors: it checks the schemas, argument checks and launcher marshalling of the binding, not torch_npu itself.
# Usage: csrc/scripts/check_binding_cpu.sh OUT.so      (tests/test_npu_binding_cpu.py runs it, cached)
set -euo pipefail
out=${1:?usage: $0 OUT.so}
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python}
read -r tinc tapi tlib abi < <("$py" - <<'PY'
import os, torch, torch.utils.cpp_extension as c
inc = c.include_paths()
print(inc[0], inc[1], os.path.join(os.path.dirname(torch.__file__), "lib"), int(torch._C._GLIBCXX_USE_CXX11_ABI))
PY
)
${CXX:-g++} -std=c++17 ${OPT:--O1} -shared -fPIC -w -D_GLIBCXX_USE_CXX11_ABI="$abi" -DSGRPO_EMU -DSGRPO_BINDING_CPU_TEST \
  -I"$here/tests/stubs" -I"$here/emu" -I"$here/ascend" -isystem "$tinc" -isystem "$tapi" \
  "$here/ascend/sgrpo_binding.cpp" "$here/ascend/sgrpo_logits_stats.cpp" "$here/ascend/sgrpo_logits_grad.cpp" \
  -L"$tlib" -ltorch -ltorch_cpu -lc10 -Wl,-rpath,"$tlib" -o "$out"
echo "built $out"
