"""The controller's parts (docs/engine.md "Module map"): the reconciler, the one writer of the snapshot
(`reconciler`, its rules' pure step in `engine/decider`), the observer of Docker (`observer`), the operations
(`operations`) and the boot (`boot`) they run, the supervisor (`supervisor`) and the liveness thread
(`livewatch`), all sharing the controller's declared state (`core`). `engine/controller.py` assembles them."""
