"""The controller's parts, each owning its state and given its few collaborators where `engine/controller.py`
composes them (docs/engine.md "Module map"): the site (settings, runtime, address: `site`), the one writer that
runs the decider's pure step and publishes (`reconciler`), the observer of Docker (`observer`), admission and the
operations' scripts (`admission`, `operations`), the boot and stop they carry out (`boot`), the drain (`drain`),
the supervisor and the wish (`supervisor`) and liveness (`livewatch`). Only the reconciler decides; the others
post facts and carry out commands."""
