"""Issue 42: the demo download is slow enough to watch, pause and resume (it finished in under a second):
the demo Hub serves a larger artifact through a link paced to a few MB/s."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import httpx

from app.backend.simhub.demo import start_demo_hub


def test_the_demo_hub_serves_a_download_that_takes_seconds() -> None:
    work = Path(tempfile.mkdtemp(prefix="moet-test-demo-pace-", dir=Path.home()))
    demo = start_demo_hub(work / "simhub")
    try:
        parts = sorted(p for p in (work / "simhub" / "repo").iterdir() if p.name != "README.md")
        total = sum(p.stat().st_size for p in parts)
        assert demo.hub.link is not None and demo.hub.link.bps <= 8 * (1 << 20), "not paced to a few MB/s"
        assert total / demo.hub.link.bps >= 4.0, f"{total} bytes at {demo.hub.link.bps} B/s: over too soon"
        # measured: one part through the paced link takes its share of the link's time
        part = parts[0]
        url = f"{demo.endpoint}/{demo.repo}/resolve/main/{part.name}"
        t0 = time.monotonic()
        got = httpx.get(url, timeout=60, follow_redirects=True)
        took = time.monotonic() - t0
        assert got.status_code == 200 and len(got.content) == part.stat().st_size
        assert took >= 0.8 * part.stat().st_size / demo.hub.link.bps, took
    finally:
        demo.stop()
        shutil.rmtree(work, ignore_errors=True)
