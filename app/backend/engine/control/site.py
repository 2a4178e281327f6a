"""Where one controller's engine lives (docs/engine.md "Module map"): the panel's settings and options, the
runtime it runs on (connected lazily, asked again while it is missing), the labels that mark its containers,
the address it listens on and the spec a start of a profile runs. The one part every other part is given;
it decides nothing and writes no engine state."""

from __future__ import annotations

import time
from typing import Callable

from app.backend.config.settings import Settings
from app.backend.contracts import Diagnosis
from app.backend.engine.builds import store as builds
from app.backend.engine.lifecycle.tickets import ControllerOptions
from app.backend.engine.logs import diagnosis as diag_mod
from app.backend.engine.runtime.base import MANAGED_LABEL, RECIPE_LABEL, Instance, Runtime, RuntimeUnavailable
from app.backend.engine.runtime.client import base_url
from app.backend.recipe.command import GPU_LABEL, RunSpec, build_run_spec
from app.backend.recipe.schema import ProfileSpec

RUNTIME_RETRY_S = 10.0  # a reader asks a missing runtime's factory again at most this often (an operation: always)


class Site:
    """The engine's place: settings, options, runtime and address (read by every part, owned here)."""

    def __init__(self, settings: Settings, options: ControllerOptions, runtime: Runtime | None,
                 runtime_factory: Callable[[], tuple[Runtime | None, str]] | None,
                 profiles_fn: Callable[[], list[ProfileSpec]]) -> None:
        self.settings = settings
        self.recipe = settings.recipe
        self.options = options
        self.runtime: Runtime | None = runtime
        self.runtime_error = ""
        self._runtime_tried = 0.0
        self._runtime_factory = runtime_factory
        self._profiles_fn = profiles_fn

    def get_runtime(self, force: bool = False) -> Runtime | None:
        """The runtime; without one, ask the factory again (operations: always; readers: every 10 s)."""
        if self.runtime is None and self._runtime_factory is not None:
            if force or time.monotonic() - self._runtime_tried >= RUNTIME_RETRY_S or not self.runtime_error:
                self._runtime_tried = time.monotonic()
                self.runtime, self.runtime_error = self._runtime_factory()
        return self.runtime

    def runtime_failure(self, exc: BaseException) -> Diagnosis:
        if isinstance(exc, RuntimeUnavailable):
            base = diag_mod.HINTS["docker_unreachable"]
            return Diagnosis(base.reason, base.title, str(exc), base.fix)
        return Diagnosis("internal_error", "Panel error during the operation", repr(exc),
                         "Retry; if it persists, report it with the Logs view content.")

    def labels(self) -> dict[str, str]:
        return {MANAGED_LABEL: "1", RECIPE_LABEL: self.recipe.id}

    def address(self) -> str:
        """Where this controller's engine listens (its GPU's socket or port on a box of several)."""
        return base_url(self.recipe, self.settings.data_dir, self.options.gpu)

    def list_mine(self, rt: Runtime) -> list[Instance]:
        """The panel's containers of this recipe on this controller's GPU (a box of several runs one engine per
        GPU, each its own controller: docs/engine.md "Several GPUs"; a container with no GPU label is GPU 0's)."""
        found = rt.list(self.labels())
        gpu = "0" if self.options.gpu is None else str(self.options.gpu)
        return [i for i in found if i.labels.get(GPU_LABEL, "0") == gpu]

    def profiles(self) -> list[ProfileSpec]:
        return self._profiles_fn()

    def run_spec(self, profile_id: str, *, plain: bool = False, build: str | None = None) -> RunSpec:
        """The spec a start of this profile runs, panel settings (`options.extra_env`) included: the one place
        it is built, so the Engine and Profiles tabs show exactly what Start runs. `plain`: the card's own
        command (no panel additions), for reading beside the card. `build`: the engine build to run (None: the
        current one, docs/engine.md "Upgrading the engine"). KeyError: unknown profile or build."""
        b = builds.registry(self.settings).resolve(build)
        return build_run_spec(self.recipe, profile_id, str(self.settings.data_dir), plain=plain,
                              extra_env=self.options.extra_env or None, profiles=self.profiles(), image=b.image,
                              build=b.id, gpu=None if plain else self.options.gpu)
