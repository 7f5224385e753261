"""The bundled trainer: `python -m train` (docs/trainer.md)."""
