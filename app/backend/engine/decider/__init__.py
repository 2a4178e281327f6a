"""The one writer's pure parts (docs/engine.md "One writer, events out"): the engine's states and the one
`transition()` that moves between them (`statemachine`), the reconciler's inbox of messages (`inbox`) and the
change events it publishes to every listener (`events`). No thread, no I/O: what the reconciler decides is
computed here from the snapshot it is handed."""
