"""`python -m train.study ...` is `python -m study ...`: the study is an application of its own (study/, installed as
`sgrpo_study` with the `sgrpo-study` command) that runs the trainer; the trainer never imports it, so this starts it
in place of this process (same arguments, environment and exit status)."""

import os
import sys

STUDY = "sgrpo_study" if __package__ == "sgrpo_train" else "study"

if __name__ == "__main__":
    os.execv(sys.executable, [sys.executable, "-m", STUDY, *sys.argv[1:]])
