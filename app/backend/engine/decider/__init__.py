"""The one decider's pure parts (docs/engine.md "One writer, events out"): the step that holds every rule
(`step`: `(decided, fact, now) -> (decided, commands)`), its vocabulary of facts, commands and the decider's own
state (`facts`), the engine's states and the one `transition()` between them (`statemachine`), the reconciler's
inbox of messages (`inbox`) and the change events it publishes to every listener (`events`). No thread, no I/O:
what the reconciler decides is computed here from what it is handed."""
