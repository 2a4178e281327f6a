"""Every Hub error a user can hit has its own message and fix (README "Hub errors", docs/downloads.md),
classified by huggingface_hub's typed errors; the panel's own downloader against the SIMULATED hub."""

from __future__ import annotations

import json
import threading
import urllib.request
from dataclasses import replace

import pytest

from app.backend.download.config import make_config
from app.backend.download.hub import HubClient, OfflineError
from app.backend.download.plan import prepare
from app.backend.download.progress import ProgressBoard
from app.backend.download.runner import run_download
from app.backend.download.types import AuthError, DownloadError, NotFoundError
from app.backend.simhub.artifacts import file_digest_tree
from app.backend.simhub.faults import Fault
from app.backend.simhub.server import SimHub

from .conftest import KNOWN_TOKEN, PREFIX, fast_config, run

REPO = "moet-panel/simulated-cache"
PART1, PART2 = PREFIX + "001", PREFIX + "002"



@pytest.fixture
def gated_hub(artifact):
    h = SimHub()
    h.add_repo(REPO, artifact.files, gated=True)
    with h.start():
        yield h


def test_no_token_for_a_private_repo_says_how_to_give_one(settings, private_hub, tmp_path):
    with pytest.raises(AuthError) as err:
        run(settings, private_hub.endpoint, tmp_path / "d")
    msg = str(err.value)
    assert "401" in msg and "needs a token" in msg and "HF_TOKEN" in msg and "--token-file" in msg


def test_gated_repo_without_a_token_names_the_access_page(settings, gated_hub, tmp_path):
    with pytest.raises(AuthError) as err:
        run(settings, gated_hub.endpoint, tmp_path / "d")
    msg = str(err.value)
    assert "gated and needs a token" in msg and f"{gated_hub.endpoint}/{REPO}" in msg


def test_gated_repo_not_yet_accepted_names_the_access_page(settings, gated_hub, tmp_path):
    with pytest.raises(AuthError) as err:
        run(settings, gated_hub.endpoint, tmp_path / "d", token=KNOWN_TOKEN)
    msg = str(err.value)
    assert "403" in msg and "not been granted access" in msg and f"{gated_hub.endpoint}/{REPO}" in msg
    assert KNOWN_TOKEN not in msg


def test_gated_repo_once_granted_downloads(settings, gated_hub, artifact, tmp_path):
    gated_hub.repos[REPO].granted_tokens.add(KNOWN_TOKEN)
    run(settings, gated_hub.endpoint, tmp_path / "d", token=KNOWN_TOKEN)
    assert file_digest_tree(tmp_path / "d") == artifact.reference


def test_repo_and_revision_not_found(settings, hub, tmp_path):
    with pytest.raises(NotFoundError) as err:
        run(settings, hub.endpoint, tmp_path / "d", repo="nobody/nothing", recipe_repo=False)
    assert "repository 'nobody/nothing' not found" in str(err.value) and "--repo" in str(err.value)
    with pytest.raises(NotFoundError) as err:
        run(settings, hub.endpoint, tmp_path / "d", revision="v9")
    assert "revision 'v9' not found" in str(err.value) and "--revision" in str(err.value)


def test_renamed_repo_is_followed(settings, hub, artifact, tmp_path):
    hub.rename_repo("old-owner/old-name", REPO)
    cfg = fast_config(settings, hub.endpoint, tmp_path / "d", repo="old-owner/old-name", recipe_repo=False)
    client = HubClient(cfg)
    board = ProgressBoard()
    run_download(cfg, list(settings.recipe.artifacts), board, threading.Event())
    assert file_digest_tree(tmp_path / "d") == artifact.reference
    assert hub.stats.requests[("renamed", "old-owner/old-name")] == 1, "the listing was redirected, then the new name used"
    client.list_files()
    assert client.renamed_from == "old-owner/old-name" and client.repo == REPO


def test_file_missing_at_that_commit(settings, hub, tmp_path):
    with urllib.request.urlopen(f"{hub.endpoint}/api/models/{REPO}/revision/main?blobs=true") as r:
        info = json.load(r)
    info["siblings"].append({"rfilename": PREFIX + "009", "size": 10,
                             "lfs": {"sha256": "a" * 64, "size": 10, "pointerSize": 134}})
    hub.add_fault("__info__", Fault("body", where="info", body=json.dumps(info).encode(), times=-1))
    with pytest.raises(NotFoundError) as err:
        run(settings, hub.endpoint, tmp_path / "d")
    assert f"{PREFIX}009 does not exist" in str(err.value) and "at that commit" in str(err.value)


def test_rate_limit_waits_what_the_hub_asks_then_says_so(settings, hub, tmp_path):
    hub.add_fault("__info__", Fault("ratelimit", where="info", retry_after=12, times=-1))
    cfg = fast_config(settings, hub.endpoint, tmp_path / "d", api_attempts=3)
    waits: list[float] = []
    with pytest.raises(DownloadError) as err:
        prepare(cfg, list(settings.recipe.artifacts), HubClient(cfg, sleep=waits.append))
    assert waits == [13.0, 13.0], "RateLimit t=12 with r=0: wait the reset (+1 s), not the backoff"
    msg = str(err.value)
    assert "rate limited by the Hub (429)" in msg and "wait 13 s" in msg


def test_rate_limit_once_is_survived(settings, hub, artifact, tmp_path):
    hub.add_fault(PART1, Fault("ratelimit", where="resolve", retry_after=0))
    run(settings, hub.endpoint, tmp_path / "d")
    assert file_digest_tree(tmp_path / "d") == artifact.reference


def test_missing_x_repo_commit_is_an_error_not_the_branch_name(settings, hub, tmp_path):
    hub.add_fault("*", Fault("no_commit", where="resolve", times=-1))
    with pytest.raises(DownloadError) as err:
        run(settings, hub.endpoint, tmp_path / "d")
    assert "without X-Repo-Commit" in str(err.value)


def test_cdn_redirect_without_etag_still_verifies_by_sha256(settings, hub, artifact, tmp_path):
    hub.add_fault("*", Fault("no_etag", where="resolve", times=-1))
    run(settings, hub.endpoint, tmp_path / "d")
    assert file_digest_tree(tmp_path / "d") == artifact.reference


def test_xet_bridge_serves_and_its_refusal_is_named(settings, hub, artifact, tmp_path):
    hub.add_fault("*", Fault("xet", where="resolve", times=-1))
    run(settings, hub.endpoint, tmp_path / "ok")
    assert file_digest_tree(tmp_path / "ok") == artifact.reference
    assert hub.stats.auth_on_cdn == 0
    hub.add_fault(PART2, Fault("status", status=403, times=-1))
    with pytest.raises(DownloadError) as err:
        run(settings, hub.endpoint, tmp_path / "bad", attempts_without_progress=2)
    assert "the Xet bridge" in str(err.value) and "403" in str(err.value)


def test_offline_mode_refuses_clearly(settings, hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OfflineError) as err:
        run(settings, hub.endpoint, tmp_path / "d")
    assert "HF_HUB_OFFLINE" in str(err.value)
    assert hub.stats.requests[("info", REPO)] == 0, "nothing was sent"


def test_token_file_flag_beats_hf_token(settings, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_fromEnvironment0000")
    f = tmp_path / "tok"
    f.write_text("hf_fromTokenFile000000\n")
    assert make_config(settings, token_file=str(f)).token == "hf_fromTokenFile000000"
    assert make_config(settings).token == "hf_fromEnvironment0000"
    assert replace(make_config(settings, token="hf_explicit0000000000"), dest=tmp_path).token == "hf_explicit0000000000"


def test_cli_token_file_beats_hf_token_and_a_missing_one_is_an_error(settings, artifact, private_hub, tmp_path,
                                                                     monkeypatch, capsys):
    from app.cli.main import main

    monkeypatch.setenv("HF_TOKEN", "hf_WrongTokenFromEnvironment0")
    f = tmp_path / "tok"
    f.write_text(KNOWN_TOKEN + "\n")
    base = ["download", "--recipe", "assets/recipes/simulated.toml", "--endpoint", private_hub.endpoint,
            "--connections", "2"]
    assert main([*base, "--dest", str(tmp_path / "d"), "--token-file", str(f)]) == 0
    assert file_digest_tree(tmp_path / "d") == artifact.reference
    assert main([*base, "--dest", str(tmp_path / "e"), "--token-file", str(tmp_path / "missing")]) == 2
    assert "--token-file" in capsys.readouterr().err
    assert main([*base, "--dest", str(tmp_path / "e")]) == 1  # HF_TOKEN alone: rejected, clearly
    err = capsys.readouterr().err
    assert "token was rejected" in err and "hf_WrongTokenFromEnvironment0" not in err
