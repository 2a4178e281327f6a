"""Keeping the engine serving (docs/engine.md "Keeps serving"): the wish that should run (`desired`), the
memory of restarts and give-ups (`history`), the healing classes with backoff and cap (`restartpolicy`), the
stall rule over the engine's own counters (`stall`) and the generation canary (`canary`). Pure rules and small
stores; the controller's supervisor and liveness thread act on them."""
