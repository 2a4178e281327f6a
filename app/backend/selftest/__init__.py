"""Self-test of the serving profile against the card's figures (docs/selftest.md). Never imports Gradio.

probe.py talks to the engine (stream timing, /tokenize, /metrics); needle.py builds haystacks in the
engine's own tokens; runner.py runs a plan as a cancellable job; store.py keeps results per profile,
engine image, recipe hash and date; report.py turns them into verdicts, Markdown and JSON.
"""
