"""The stability study, an application above the trainer: `python -m study` (`sgrpo-study` installed; docs/study.md).
It starts the trainer as processes and reads their run folders; study/trainer.py is its one seam to the trainer."""
