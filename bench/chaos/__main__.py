"""`python -m bench.chaos`: the chaos soak (bench/chaos/run.py)."""

from bench.chaos.run import main

raise SystemExit(main())
