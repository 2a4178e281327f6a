"""Alerts: the rules that find what is wrong (`rules`: pool absent, churn trap, VRAM, ECC, throttling, …, with
their hold-down) and their delivery to a person (`delivery`: the tracker and the sending thread; `notify`: the
Apprise targets, masked wherever shown). docs/telemetry.md "Alerts", docs/engine.md "Telling a person"."""
