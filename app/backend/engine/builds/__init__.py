"""Engine builds (docs/engine.md "Building the engine image", "Upgrading the engine"): the registry of builds
with the current pin (`store`), building an image with docker-py (`image`) and the background build job
that records the result (`job`). Promote and roll back, which need the controller, are `engine/upgrade.py`."""
