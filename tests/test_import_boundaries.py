"""The layering holds (README, "Contracts and import boundaries"): parsed from the source with `ast`, no
import runs. Every import counts here, in functions and under `if TYPE_CHECKING:` too; the cycle check counts
as scripts/import_cycles.py does (TYPE_CHECKING imports left out), at module level and inside functions."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]

# Libraries that reach a daemon, a driver, the network or a database: the UI asks the backend's services.
UI_FORBIDDEN = ("docker", "pynvml", "httpx", "requests", "aiohttp", "openai", "pycurl", "websockets", "urllib.request",
                "http.client", "http.server", "socket", "socketserver", "sqlite3")


@functools.cache
def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_cycles", ROOT / "scripts" / "import_cycles.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.cache
def _all_imports() -> dict[str, set[str]]:
    """Module -> every absolute name it imports anywhere (relative imports resolved)."""
    out: dict[str, set[str]] = {}
    for name, f in _script().module_files(ROOT).items():
        is_pkg = f.name == "__init__.py"
        names: set[str] = set()
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.Import):
                names.update(a.name for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = name.split(".") if is_pkg else name.split(".")[:-1]
                    parts = parts[: len(parts) - (n.level - 1)]
                    base = ".".join([*parts, base] if base else parts)
                names.add(base)
                names.update(f"{base}.{a.name}" for a in n.names)
        out[name] = names
    return out


def _hits(importers: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    def under(name: str, prefixes: tuple[str, ...]) -> bool:
        return any(name == p or name.startswith(p + ".") for p in prefixes)

    return sorted(f"{mod} imports {imp}" for mod, names in _all_imports().items() if under(mod, (importers,))
                  for imp in names if under(imp, forbidden) and not under(imp, allowed))


def test_ui_reaches_no_daemon_driver_network_or_database() -> None:
    assert _hits("app.ui", UI_FORBIDDEN) == []


def test_backend_imports_no_gradio_and_no_ui() -> None:
    assert _hits("app.backend", ("gradio", "app.ui")) == []


def test_engine_reads_telemetry_only_through_the_contracts() -> None:
    # The GPU sample and reader types, the snapshot and the pool sizing are app.backend.contracts'; the
    # /metrics parser is the engine's own (engine/runtime/metrics_text.py), which telemetry imports.
    assert _hits("app.backend.engine", ("app.backend.telemetry",)) == []


def test_contracts_import_nothing_from_the_app() -> None:
    assert _hits("app.backend.contracts", ("app",)) == []


def test_no_import_cycles() -> None:
    script = _script()
    assert script.cycles(script.graph(ROOT)) == []  # module level
    assert script.cycles(script.graph(ROOT, deep=True)) == []  # imports inside functions too


def test_the_checks_see_a_violation() -> None:
    # Guard against a parser that finds nothing: the UI does import the backend, the engine the contracts.
    names = _all_imports()
    assert any(n.startswith("app.backend.") for n in names["app.ui.app"])
    assert "app.backend.contracts" in names["app.backend.engine.lifecycle.gpurelease"]
    assert _hits("app.backend.telemetry", ("app.backend.engine",))  # the allowed direction is seen


# The rooms of app/backend (docs/architecture.md): the foundations every room may use, the services, and the
# wiring (`state`) that builds them all. A foundation never reaches up into a service.
FOUNDATIONS = ("app.backend.contracts", "app.backend.files", "app.backend.oplog", "app.backend.jobs",
               "app.backend.recipe", "app.backend.config")
SERVICES = tuple(f"app.backend.{p}" for p in ("engine", "download", "telemetry", "chat", "gateway", "selftest",
                                               "abtest", "alerts", "service", "prometheus", "state", "web",
                                               "simhub", "simengine", "profiles", "evidence"))


def test_the_foundations_reach_no_service() -> None:
    assert [hit for root in FOUNDATIONS for hit in _hits(root, SERVICES)] == []


def test_only_the_views_of_the_whole_panel_import_its_wiring() -> None:
    # the /metrics export and the Service tab's view read every service; nothing else builds on the app state
    allowed = ("app.backend.state", "app.backend.prometheus", "app.backend.service.panel")
    hits = [h for h in _hits("app.backend", ("app.backend.state",)) if not h.startswith(allowed)]
    assert hits == []


def test_backend_rooms_are_packages_with_at_most_three_spine_modules() -> None:
    backend = ROOT / "app" / "backend"
    spine = sorted(p.name for p in backend.glob("*.py") if p.name != "__init__.py")
    assert spine == ["contracts.py", "jobs.py", "state.py"]


# The drawn layers (docs/architecture.md "Layers", read from its table): a module imports only its own layer
# and the ones below; the one way up is the views' read of the wiring (`state`, tested above).
def _drawn_layers() -> list[tuple[str, tuple[str, ...]]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    lines = text.split("## Layers", 1)[1].splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    rows = [ln for ln in lines[first:first + 50] if ln.startswith("|")]
    rows = rows[:next((i for i, ln in enumerate(lines[first:]) if not ln.startswith("|")), len(rows))]
    layers = []
    for row in rows[2:]:
        name, rooms = (c.strip() for c in row.strip("|").split("|")[:2])
        mods = tuple("app." + r.strip(" `/").replace(".py", "").replace("/", ".") if r.strip(" `").startswith(("cli", "ui"))
                     else "app.backend." + r.strip(" `/").replace(".py", "") for r in rooms.split(","))
        layers.append((name, mods))
    return layers


def _layer_of(module: str, layers: list[tuple[str, tuple[str, ...]]]) -> int | None:
    for i, (_, mods) in enumerate(layers):
        if any(module == m or module.startswith(m + ".") for m in mods):
            return i
    return None


def test_every_room_of_the_backend_is_drawn_in_one_layer() -> None:
    layers = _drawn_layers()
    assert [n for n, _ in layers][:2] == ["entry", "wiring"] and layers[-1][0] == "foundations"
    drawn = [m for _, mods in layers for m in mods]
    assert len(drawn) == len(set(drawn))
    backend = ROOT / "app" / "backend"
    rooms = {f"app.backend.{p.name}" for p in backend.iterdir() if p.is_dir() and p.name != "__pycache__"}
    rooms |= {f"app.backend.{p.stem}" for p in backend.glob("*.py") if p.name != "__init__.py"}
    assert rooms | {"app.cli", "app.ui"} == set(drawn)


def test_no_module_imports_a_layer_drawn_above_its_own() -> None:
    layers = _drawn_layers()
    up = []
    for mod, names in _all_imports().items():
        mine = _layer_of(mod, layers)
        for name in names:
            theirs = _layer_of(name, layers)
            if mine is not None and theirs is not None and theirs < mine and name != mod:
                up.append(f"{mod} ({layers[mine][0]}) imports {name} ({layers[theirs][0]})")
    allowed = ("app.backend.prometheus", "app.backend.service.panel")  # the views read the wiring
    assert sorted(h for h in up if not (h.startswith(allowed) and " imports app.backend.state" in h)) == []


def test_the_layer_check_sees_a_violation() -> None:
    layers = _drawn_layers()
    engine, abtest, state = (_layer_of(m, layers) for m in ("app.backend.engine.controller", "app.backend.abtest.runner",
                                                            "app.backend.state"))
    assert engine is not None and abtest is not None and state is not None and state < abtest < engine


def test_the_strict_backend_says_any_at_most_40_times() -> None:
    """Issue 50 item 5: `Any` in app/backend (lines that name it, imports included) stays at most 40; decoded JSON
    is `contracts.JsonObject`, named once."""
    lines = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "app" / "backend").rglob("*.py"))
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if re.search(r"\bAny\b", line)]
    assert len(lines) <= 40, "\n".join(lines)
