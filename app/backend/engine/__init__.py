"""Engine control (docs/engine.md): the facades at the top — `controller` (one GPU's engine), `gpus` (the GPUs of
this box, one engine each), `upgrade` (promote and roll back a build) and `errlog` (caught errors, once) — over
sub-packages by concern, imported only downwards (tests/engine/test_engine_packages.py holds it):
`control` (the controller's parts and threads) uses `lifecycle`, `supervision`, `builds`, `logs`, `decider` and
`runtime`; nothing imports `control` but the facades."""
