"""Several boxes behind one endpoint (docs/fleet.md): the fleet file, the boxes' checks, vLLM's router run and
supervised on the front's loopback, the front gateway's status of the fleet, and the Prometheus configuration.
"Fleet" means boxes here; the GPUs of one box are the engine's business (docs/engine.md "Several GPUs")."""
