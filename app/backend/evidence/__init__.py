"""Evidence for an engine build: a view of the whole panel (docs/architecture.md), read by the Engine tab's
upgrade section and the CLI. It reads what the measurements (`selftest/`, `abtest/`) and the engine's build
registry recorded; the engine itself never imports it (the engine sits below the measurements)."""
