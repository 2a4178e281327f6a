"""The environment is read in one module (app/backend/config/env.py) and documented in one table (docs/configuration.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.backend.config import env

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
# The SIMULATED engine is a separate program that runs in its own container with only its own package
# (app/backend/simengine/image.py copies it alone): it reads its own MOET_SIM_* variables itself.
EXEMPT = (APP / "backend" / "config" / "env.py", APP / "backend" / "simengine")
READS = re.compile(r"\bos\.(?:environ|getenv|putenv|unsetenv)\b|\bfrom os import\b[^\n]*\b(?:environ|getenv)\b|\bgetenv\(")


def test_no_module_outside_env_reads_the_environment() -> None:
    offenders = []
    for path in sorted(APP.rglob("*.py")):
        if any(path == e or e in path.parents for e in EXEMPT):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if READS.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "read the environment through app.backend.config.env:\n" + "\n".join(offenders)


def test_the_grep_would_see_a_read() -> None:
    for line in ('x = os.environ.get("HF_TOKEN")', "os.getenv('X')", "from os import environ"):
        assert READS.search(line), line


def test_every_variable_is_in_the_table() -> None:
    table = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    names = [v for k, v in vars(env).items() if k.isupper() and isinstance(v, str) and v.isupper()]
    names += list(env.HF_OFFLINE)
    missing = [n for n in names if f"`{n}`" not in table]
    assert len(names) >= 12 and not missing, missing


def test_accessors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.SERVER_PORT, " 8080 ")
    monkeypatch.setenv(env.HF_TOKEN, "  ")
    monkeypatch.setenv(env.HF_TOKEN_LEGACY, "hf_legacy")
    monkeypatch.setenv("HF_HUB_OFFLINE", "yes")
    monkeypatch.setenv(env.GPU, "SIMULATED")
    assert env.server_port() == 8080 and env.hf_token() == "hf_legacy" and env.hf_offline()
    assert env.gpu_mode() == "simulated"
    monkeypatch.setenv(env.SERVER_PORT, "eighty")
    with pytest.raises(ValueError, match="GRADIO_SERVER_PORT"):
        env.server_port()
    monkeypatch.setenv(env.GPU, "cuda")
    with pytest.raises(ValueError, match="expected nvml, simulated or none"):
        env.gpu_mode()
    monkeypatch.setenv("KEEP_ME", "1")
    monkeypatch.setenv("MOET_SIM_X", "2")
    assert env.inherited(("KEEP_ME",), prefixes=("MOET_SIM_",)) == {"KEEP_ME": "1", "MOET_SIM_X": "2"}
