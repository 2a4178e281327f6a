"""Files the panel keeps: the atomic, durable write and the file lock (`atomic`), private modes (`modes`), and
the one small typed JSON state file (`jsonstore`). docs/ui-and-safety.md "File modes"."""
