"""The stability study: python -m train.study (docs/study.md)."""
