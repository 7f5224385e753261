"""Build script. The package is pure Python unless the Ascend CANN toolchain is present.

The AscendC extension in csrc/ (kernels + torch_npu binding, csrc/CMakeLists.txt) is built only when ASCEND_HOME_PATH
points at a CANN install and SOC_VERSION names the chip (e.g. Ascend910B3); it lands next to the npu backend as
sgrpo_kernels/backends/_sgrpo_npu*.so. Everywhere else this prints one line saying the build was skipped and installs
the Python package alone (`pip install -e .` works with no toolchain).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
EXT_NAME = "sgrpo_kernels.backends._sgrpo_npu"


def _ascend_config() -> tuple[bool, str]:
    home = os.environ.get("ASCEND_HOME_PATH")
    if not home:
        return False, "ASCEND_HOME_PATH not set"
    if not os.path.isdir(home):
        return False, f"ASCEND_HOME_PATH={home} is not a directory"
    if not os.environ.get("SOC_VERSION"):
        return False, "SOC_VERSION not set (e.g. SOC_VERSION=Ascend910B3, see `npu-smi info`)"
    if shutil.which("cmake") is None:
        return False, "cmake not found"
    return True, f"ASCEND_HOME_PATH={home} SOC_VERSION={os.environ['SOC_VERSION']}"


class CMakeBuild(build_ext):
    """Configures and builds csrc/ with CMake, then copies _sgrpo_npu.so to where setuptools expects the extension."""

    def build_extension(self, ext: Extension) -> None:
        build_dir = Path(self.build_temp) / "sgrpo_npu"
        build_dir.mkdir(parents=True, exist_ok=True)
        cfg = [
            "cmake", "-S", str(ROOT / "csrc"), "-B", str(build_dir), f"-DSOC_VERSION={os.environ['SOC_VERSION']}",
            f"-DASCEND_HOME_PATH={os.environ['ASCEND_HOME_PATH']}", f"-DPython3_EXECUTABLE={sys.executable}",
            "-DCMAKE_BUILD_TYPE=Release",
        ]
        subprocess.run(cfg, check=True)
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "_sgrpo_npu", "-j", jobs], check=True)
        built = next(build_dir.rglob("_sgrpo_npu.so"))
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, dest)
        print(f"sgrpo-kernels: built the AscendC extension -> {dest}", file=sys.stderr)


_build, _why = _ascend_config()
if _build:
    print(f"sgrpo-kernels: {_why}: building the AscendC extension from csrc/ (CMake)", file=sys.stderr)
    setup(ext_modules=[Extension(EXT_NAME, sources=[])], cmdclass={"build_ext": CMakeBuild})
else:
    print(f"sgrpo-kernels: {_why}, skipping the AscendC extension (pure-Python install)", file=sys.stderr)
    setup()
