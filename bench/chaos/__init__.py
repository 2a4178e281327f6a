"""The chaos soak (issue 39): faults that heal by themselves, against a demo panel on the real Docker
(docs/engine.md, "Chaos soak"). `python -m bench.chaos --help`."""
