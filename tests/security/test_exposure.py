"""The panel serves no files from the repo, the data dir or the system, no monitoring, no footer API links, no analytics."""

from __future__ import annotations

import httpx


def test_file_routes_do_not_serve_local_files(shared_panel) -> None:
    secret = shared_panel.data_dir / "secret-in-data-dir.txt"
    secret.write_text("do-not-serve")
    with httpx.Client(timeout=10) as c:
        for target in ("pyproject.toml", "/etc/passwd", str(secret), str(shared_panel.state.settings.state_dir)):
            r = c.get(f"{shared_panel.url}/gradio_api/file={target}")
            assert r.status_code in (403, 404), (target, r.status_code)
            assert "do-not-serve" not in r.text and "root:" not in r.text
        assert c.get(f"{shared_panel.url}/monitoring").status_code in (403, 404)
        config = c.get(shared_panel.url + "/config").json()
        assert config["footer_links"] == [] and config["analytics_enabled"] is False
