"""The SIMULATED Hub checked by the real `huggingface_hub` client (issue 12 item 2): what the panel's
tests trust about simhub is what the Hub's reference client accepts, byte for byte and error for error."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError, FileMetadataError, GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile

from app.backend.simhub.faults import Fault
from app.backend.simhub.server import SimHub

from .conftest import KNOWN_TOKEN, PREFIX

REPO = "moet-panel/simulated-cache"
PART1 = PREFIX + "001"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_hf_hub_download_is_byte_identical(hub, artifact, tmp_path):
    got = hf_hub_download(REPO, PART1, endpoint=hub.endpoint, cache_dir=tmp_path / "cache", token=False)
    assert Path(got).read_bytes() == artifact.files[PART1].read_bytes()
    assert hub.stats.cdn_requests(PART1) >= 1, "the bytes came from the CDN origin"


def test_list_repo_tree_follows_link_pages_and_reports_lfs(hub, artifact):
    entries = list(HfApi(endpoint=hub.endpoint).list_repo_tree(REPO, recursive=True, token=False))
    files = {e.path: e for e in entries if isinstance(e, RepoFile)}
    assert set(files) == set(artifact.files)
    assert hub.stats.requests[("tree", REPO)] >= 2, "page_size=2: the client followed Link rel=next"
    assert files[PART1].lfs is not None and files[PART1].lfs.sha256 == sha256(artifact.files[PART1])


def test_model_info_gives_commit_and_lfs_sha256_in_one_answer(hub, artifact):
    info = HfApi(endpoint=hub.endpoint).model_info(REPO, revision="main", files_metadata=True, token=False)
    assert info.sha == hub.repos[REPO].commit
    by_name = {s.rfilename: s for s in info.siblings or []}
    assert by_name[PART1].size == artifact.files[PART1].stat().st_size
    assert by_name[PART1].lfs is not None and by_name[PART1].lfs.sha256 == sha256(artifact.files[PART1])


def test_get_hf_file_metadata_stops_at_the_cdn(hub, artifact):
    meta = get_hf_file_metadata(hf_hub_url(REPO, PART1, endpoint=hub.endpoint), token=False)
    assert meta.commit_hash == hub.repos[REPO].commit
    assert meta.etag == sha256(artifact.files[PART1])
    assert meta.size == artifact.files[PART1].stat().st_size
    assert meta.location.startswith(hub.cdn_endpoint + "/cdn/"), meta.location


def test_private_hub_errors_are_the_librarys_own(artifact, private_hub, tmp_path):
    url = hf_hub_url(REPO, PART1, endpoint=private_hub.endpoint)
    with pytest.raises(RepositoryNotFoundError) as err:  # 401 without a token: private or missing
        get_hf_file_metadata(url, token=False)
    assert err.value.response.status_code == 401
    with pytest.raises(HfHubHTTPError) as bad:  # a wrong token: 401 "Invalid credentials"
        get_hf_file_metadata(url, token="hf_WrongTokenWrongToken000000")
    assert bad.value.response.status_code == 401 and not isinstance(bad.value, RepositoryNotFoundError)
    got = hf_hub_download(REPO, PART1, endpoint=private_hub.endpoint, cache_dir=tmp_path / "c", token=KNOWN_TOKEN)
    assert Path(got).read_bytes() == artifact.files[PART1].read_bytes()


def test_gated_repo_raises_gated_repo_error(artifact, tmp_path):
    h = SimHub()
    h.add_repo(REPO, artifact.files, gated=True)
    with h.start():
        url = hf_hub_url(REPO, PART1, endpoint=h.endpoint)
        with pytest.raises(GatedRepoError) as anon:
            get_hf_file_metadata(url, token=False)
        assert anon.value.response.status_code == 401
        with pytest.raises(GatedRepoError) as denied:
            hf_hub_download(REPO, PART1, endpoint=h.endpoint, cache_dir=tmp_path / "c", token=KNOWN_TOKEN)
        assert denied.value.response.status_code == 403
        info = HfApi(endpoint=h.endpoint).model_info(REPO, files_metadata=True, token=False)
        assert info.sha == h.repos[REPO].commit, "a gated repo's metadata stays public, as on the Hub"


def test_missing_repo_revision_and_file_raise_typed_errors(hub, tmp_path):
    api = HfApi(endpoint=hub.endpoint)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("nobody/nothing", token=False)
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="v9", token=False)
    with pytest.raises(RevisionNotFoundError):
        get_hf_file_metadata(hf_hub_url(REPO, PART1, revision="v9", endpoint=hub.endpoint), token=False)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "no-such-file.bin", endpoint=hub.endpoint, cache_dir=tmp_path / "c", token=False)


def test_rate_limit_is_hf_hub_http_error_429(hub):
    hub.add_fault(PART1, Fault("ratelimit", where="resolve", retry_after=7))
    with pytest.raises(HfHubHTTPError) as err:
        get_hf_file_metadata(hf_hub_url(REPO, PART1, endpoint=hub.endpoint), token=False)
    assert err.value.response.status_code == 429
    assert "Retry after 7 seconds" in str(err.value), "the library read the Hub's RateLimit header"


def test_renamed_repo_is_followed_by_relative_redirect(hub, artifact, tmp_path):
    hub.rename_repo("old-owner/old-name", REPO)
    got = hf_hub_download("old-owner/old-name", PART1, endpoint=hub.endpoint, cache_dir=tmp_path / "c",
                          token=False)
    assert Path(got).read_bytes() == artifact.files[PART1].read_bytes()
    info = HfApi(endpoint=hub.endpoint).model_info("old-owner/old-name", files_metadata=True, token=False)
    assert info.id == REPO
    assert hub.stats.requests[("renamed", "old-owner/old-name")] >= 2


def test_cdn_redirect_without_etag_is_refused_by_the_client(hub, tmp_path):
    hub.add_fault(PART1, Fault("no_etag", where="resolve", times=-1))
    meta = get_hf_file_metadata(hf_hub_url(REPO, PART1, endpoint=hub.endpoint), token=False)
    assert meta.etag is None and meta.commit_hash
    with pytest.raises(LocalEntryNotFoundError) as err:  # nothing cached: the metadata error, wrapped
        hf_hub_download(REPO, PART1, endpoint=hub.endpoint, cache_dir=tmp_path / "c", token=False)
    assert isinstance(err.value.__cause__, FileMetadataError) and "ETag" in str(err.value)


def test_missing_commit_header_is_refused_by_the_client(hub, tmp_path):
    hub.add_fault(PART1, Fault("no_commit", where="resolve", times=-1))
    with pytest.raises(LocalEntryNotFoundError) as err:
        hf_hub_download(REPO, PART1, endpoint=hub.endpoint, cache_dir=tmp_path / "c", token=False)
    assert isinstance(err.value.__cause__, FileMetadataError) and "X-Repo-Commit" in str(err.value)


def test_xet_answer_is_recognised_by_the_client(hub):
    hub.add_fault(PART1, Fault("xet", where="resolve"))
    meta = get_hf_file_metadata(hf_hub_url(REPO, PART1, endpoint=hub.endpoint), token=False)
    assert meta.xet_file_data is not None and meta.xet_file_data.refresh_route.startswith(hub.endpoint)
    assert "/cas-bridge/" in meta.location


def test_a_started_hub_entered_as_a_context_stops_every_server_thread(artifact):
    """`with hub.start():` once ran a second serve_forever per server; stop() ended one, and the other
    spun on the closed socket for the rest of the suite (CI's browser tests ran 3–10× slower)."""

    def serving() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("simhub") and t.is_alive()]

    before = set(serving())
    h = SimHub()
    h.add_repo(REPO, artifact.files)
    with h.start():
        assert len(set(serving()) - before) == 2, "one thread per server: the API and the CDN"
    for t in set(serving()) - before:
        t.join(5)
    assert not set(serving()) - before
