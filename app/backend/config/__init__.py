"""Configuration: the environment (`env`, the one module that reads it), the resolved `settings` (recipe, data
dir, demo mode) and the Hugging Face token (`hf_token`).
docs/configuration.md."""
