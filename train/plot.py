"""`python -m train.plot ...` is `python -m study.plot ...` (the run plots moved to the study application, study/):
the trainer never imports it, so this starts it in place of this process (same arguments and exit status)."""

import os
import sys

PLOT = "sgrpo_study.plot" if __package__ == "sgrpo_train" else "study.plot"

if __name__ == "__main__":
    os.execv(sys.executable, [sys.executable, "-m", PLOT, *sys.argv[1:]])
