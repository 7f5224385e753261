"""Integrations with other trainers and model libraries: `hf` (the LM head of a Hugging Face model), `trl`
(SGRPOTrainer for TRL; needs the `trl` extra). Import the submodule you need; nothing here is imported by default."""
