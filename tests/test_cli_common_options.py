"""`--demo`, `--data-dir`, `--recipe` and `--json` are accepted by every subcommand at any position, with the
same effect (issue 29 item 5): one parametrised test over all subcommands, plus the reported defects
(`abtest list`, `telemetry --once`, `command --plain` under --demo; `-h` listing them, on each sub-action
too, e.g. `keys create -h`). `--demo` never touches the real /data/ds4."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.backend.recipe import SIMULATED_RECIPE
from app.cli.main import SUBCOMMANDS, build_parser, main, parse

# A harmless invocation of each subcommand (it stops at building Settings below, or only reads a file).
INVOCATIONS: dict[str, list[str]] = {
    "serve": ["serve", "--port", "0"],
    "command": ["command", "--profile", "quality"],
    "download": ["download"],
    "engine": ["engine", "status"],
    "telemetry": ["telemetry", "--once"],
    "trace": ["trace", "summarize", "LOG"],
    "chat": ["chat", "hello"],
    "simulate-engine": ["simulate-engine"],
    "selftest": ["selftest", "--profile", "quality"],
    "abtest": ["abtest", "list"],
    "keys": ["keys", "list"],
    "fleet": ["fleet", "list"],
    "gateway": ["gateway", "--port", "0"],
    "service": ["service", "install", "--user", "--print"],
    "logs": ["logs", "--panel"],
}


class Built(Exception):
    """Raised by the recording resolve_settings: the command got as far as its Settings."""


def test_every_subcommand_is_covered() -> None:
    assert set(INVOCATIONS) == set(SUBCOMMANDS)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "share"))
    for name in ("MOET_PANEL_DEMO", "MOET_PANEL_DATA_DIR", "MOET_PANEL_RECIPE", "MOET_PANEL_GPU"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path


def _positions(cmd: list[str], recipe: str, data: str) -> list[list[str]]:
    common = ["--demo", "--data-dir", data, "--recipe", recipe, "--json"]
    return [
        [*common, *cmd],                                         # before the subcommand
        [*cmd, *common],                                         # at the end
        [cmd[0], "--json", "--demo", *cmd[1:], f"--recipe={recipe}", f"--data-dir={data}"],  # mixed, = form
    ]


@pytest.mark.parametrize("name", list(INVOCATIONS))
def test_common_options_anywhere_same_effect(name: str, home: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    data = home / "data"
    log = home / "LOG"
    log.write_text("")
    cmd = [a if a != "LOG" else str(log) for a in INVOCATIONS[name]]
    parsed = []
    for argv in _positions(cmd, str(SIMULATED_RECIPE), str(data)):
        _, args = parse(argv)
        parsed.append((args.recipe, args.data_dir, args.demo, args.json))
    assert parsed == [(str(SIMULATED_RECIPE), str(data), True, True)] * 3, parsed

    if name == "trace":  # reads a log file only: no Settings; the options are accepted and --json holds
        for argv in _positions(cmd, str(SIMULATED_RECIPE), str(data)):
            assert main(argv) == 0
        return
    if name == "service":  # builds no Settings: the options go into the unit's `serve` command, same effect
        for argv in _positions(cmd, str(SIMULATED_RECIPE), str(data)):
            main(argv)
            unit = capsys.readouterr().out
            assert f"--recipe {SIMULATED_RECIPE.resolve()} --data-dir {data} --demo" in unit, unit
        return
    import app.backend.config.settings as settings_mod

    real = settings_mod.resolve_settings
    seen: list[tuple[Any, ...]] = []

    def recording(*a: Any, **kw: Any) -> Any:
        s = real(*a, **kw)
        seen.append((s.recipe_path, s.data_dir, s.demo))
        raise Built

    monkeypatch.setattr(settings_mod, "resolve_settings", recording)
    for argv in _positions(cmd, str(SIMULATED_RECIPE), str(data)):
        with pytest.raises(Built):
            main(argv)
    assert seen == [(SIMULATED_RECIPE.resolve(), data, True)] * 3, seen

    # --demo alone: the SIMULATED recipe and the per-user demo data dir, never the real card's /data/ds4
    seen.clear()
    for argv in ([*cmd, "--demo"], ["--demo", *cmd]):
        with pytest.raises(Built):
            main(argv)
    assert seen == [(SIMULATED_RECIPE.resolve(), home / "share" / "moet-panel" / "demo", True)] * 2, seen


@pytest.mark.parametrize("name", list(INVOCATIONS))
def test_help_lists_the_common_options(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([INVOCATIONS[name][0], "-h"])
    out = capsys.readouterr().out
    assert all(opt in out for opt in ("--demo", "--json", "--recipe", "--data-dir")), out


def _actions(name: str) -> list[str]:
    """The sub-actions of a subcommand (`keys create`, `engine start`, ...), from its real parser."""
    parser = build_parser(only=name)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    top = sub.choices[name]
    return [a for act in top._actions if isinstance(act, argparse._SubParsersAction) for a in act.choices]


ACTIONS = [(name, action) for name in INVOCATIONS for action in _actions(name)]


def test_actions_are_found() -> None:  # the walk below is not vacuous
    assert {("keys", "create"), ("service", "install"), ("engine", "start"), ("abtest", "list")} <= set(ACTIONS)


@pytest.mark.parametrize(("name", "action"), ACTIONS)
def test_action_help_lists_the_common_options(name: str, action: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([name, action, "-h"])
    out = capsys.readouterr().out
    assert all(opt in out for opt in ("--demo", "--json", "--recipe", "--data-dir")), out


def test_demo_abtest_list_telemetry_command(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from app.backend.abtest.journal import Journal, new_spec
    from app.backend.config.settings import demo_data_dir

    spec = new_spec("quality", "balanced", ["p"], [1], 16)
    Journal(demo_data_dir() / ".moet-panel").create(spec)
    for argv in (["--demo", "abtest", "list"], ["abtest", "--demo", "list"], ["abtest", "list", "--demo"]):
        assert main(argv) == 0
        assert spec.run_id in capsys.readouterr().out, argv
    assert main(["abtest", "list", "--demo", "--json"]) == 0
    assert f'"run_id": "{spec.run_id}"' in capsys.readouterr().out

    assert main(["--demo", "telemetry", "--once", "--json"]) == 0  # the SIMULATED GPU, not this box's NVML
    assert '"simulated": true' in capsys.readouterr().out

    assert main(["command", "--plain", "--demo", "--profile", "quality"]) == 0
    out = capsys.readouterr().out
    assert "sim-engine" in out and "/data/ds4" not in out, out
