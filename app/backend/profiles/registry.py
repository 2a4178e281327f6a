"""The profiles a user can serve: the recipe's, plus custom ones saved in the data dir.

`ProfileRegistry` is the one listing the panel reads (engine, tabs, header, alerts, telemetry, self-test, CLI),
built beside the settings (the app state's `profiles`; a CLI command or a service builds its own: every one reads
the same folder, docs/card.md "The effective command"): cached, and re-read only when
the custom-profile folder changes (a save from the Profiles tab, another panel or the CLI), told by a cheap
`stat` signature, so a saved profile is selectable everywhere without a restart (issue 29) and the 1 s page
timer never parses TOML.
"""

from __future__ import annotations


import builtins
import os
import threading

from app.backend.profiles.custom import load_custom_profiles, profiles_dir
from app.backend.recipe.schema import ProfileSpec

from app.backend.config.settings import Settings

Signature = tuple[tuple[str, int, int], ...]


def all_profiles(settings: Settings) -> list[ProfileSpec]:
    """Recipe profiles first, then custom profiles (see app.backend.profiles.custom)."""
    return list(settings.recipe.profiles) + load_custom_profiles(settings)


def profile_label(p: ProfileSpec) -> str:
    """The one name shown for a profile, linking the card's number and title to the id the CLI, the chat
    stats and the logs use: "#2 quality / speed (balanced)"; custom: "my test (custom: my-test)"."""
    if p.measured:
        return f"#{p.number} {p.title} ({p.id})" if p.title != p.id else f"#{p.number} {p.title}"
    return f"{p.title} (custom: {p.id})" if p.title != p.id else f"{p.title} (custom)"


class ProfileRegistry:
    """The recipe's profiles plus this data dir's custom ones, cached until the folder changes."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._sig: Signature | None = None
        self._profiles: list[ProfileSpec] = []

    def _signature(self) -> Signature:
        folder = profiles_dir(self.settings)
        try:
            with os.scandir(folder) as it:
                entries = [(e.name, st.st_mtime_ns, st.st_size) for e in it if e.name.endswith(".toml")
                           for st in (e.stat(),)]
        except (FileNotFoundError, NotADirectoryError):
            return ()
        return tuple(sorted(entries))

    def list(self) -> list[ProfileSpec]:
        sig = self._signature()
        with self._lock:
            if sig != self._sig:
                self._profiles = all_profiles(self.settings)
                self._sig = sig
            return list(self._profiles)

    def version(self) -> str:
        """Changes whenever the listing does (for a page to know it must redraw its choices)."""
        return str(hash(self._signature()))

    def ids(self) -> builtins.list[str]:
        return [p.id for p in self.list()]

    def find(self, profile_id: str | None) -> ProfileSpec | None:
        return next((p for p in self.list() if p.id == profile_id), None)

    def label(self, profile_id: str | None) -> str:
        if not profile_id:
            return "no profile"
        p = self.find(profile_id)
        return profile_label(p) if p is not None else profile_id

    def choices(self) -> builtins.list[tuple[str, str]]:
        """(label, id) pairs for a dropdown or radio."""
        return [(profile_label(p), p.id) for p in self.list()]
