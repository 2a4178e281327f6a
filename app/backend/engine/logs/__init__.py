"""What the engine's logs and exits say: the stored log of every run (`logstore`) and its follower
(`following`), the boot's phases read from the log (`bootlog`, `loglines`), the failure classes with their
fixes (`diagnosis`) and the explanation of an exit (`exits`). Read-only judgements over text; no state of the
engine is written here."""
