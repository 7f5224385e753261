"""Build script. The package is pure Python unless the Ascend CANN toolchain is present.

The AscendC extension in csrc/ is built only when ASCEND_HOME_PATH points at a CANN install (see csrc/README.md);
everywhere else this prints one line saying the build was skipped and installs the Python package alone.
"""

import os
import sys

from setuptools import setup


def _ascend_requested() -> bool:
    home = os.environ.get("ASCEND_HOME_PATH")
    return bool(home) and os.path.isdir(home)


if _ascend_requested():
    print("sgrpo-kernels: ASCEND_HOME_PATH is set, but the csrc/ build is not wired up yet; installing pure Python",
          file=sys.stderr)
else:
    print("sgrpo-kernels: ASCEND_HOME_PATH not set, skipping the AscendC extension (pure-Python install)",
          file=sys.stderr)

setup()
