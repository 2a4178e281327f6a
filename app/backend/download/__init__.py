"""Verified, resumable, parallel chunk downloads (no Gradio here). See docs/downloads.md."""
