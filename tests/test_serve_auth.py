"""The API key of `rlscope serve`: required for every request but ``healthz`` when set (the
SDK sends its key as ``X-API-Key``), 401 for a missing or wrong key, the official SDK works
with the right one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

tinker = pytest.importorskip("tinker")
pytest.importorskip("fastapi")

import httpx  # noqa: E402
from serve_util import Server, running_server  # noqa: E402

KEY = "tml-test-0123456789abcdef"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("auth"), api_key=KEY) as srv:
        yield srv


def test_requests_without_the_right_key_get_401(server: Server) -> None:
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        assert client.get("/api/v1/healthz").status_code == 200  # open: a liveness probe
        for headers in ({}, {"X-API-Key": "tml-wrong-0123456789abcdef"},
                        {"X-API-Key": KEY[:-1]}, {"Authorization": f"Bearer {KEY}"}):
            for path in ("/api/v1/client/config", "/api/v1/create_session",
                         "/api/v1/retrieve_future"):
                r = client.post(path, json={}, headers=headers)
                assert r.status_code == 401, (path, headers)
                assert KEY not in r.text
            assert client.get("/api/v1/training_runs", headers=headers).status_code == 401
        ok = client.post("/api/v1/client/config", json={"sdk_version": "0.38.0"},
                         headers={"X-API-Key": KEY})
        assert ok.status_code == 200


def test_the_sdk_works_with_the_key_and_fails_without(server: Server) -> None:
    service = tinker.ServiceClient(base_url=server.base_url, api_key=KEY)
    tc = service.create_lora_training_client(base_model=str(server.tokenizer_dir),
                                             rank=4).result()
    assert tc.get_info().lora_rank == 4
    service.close("success")

    def wrong() -> None:
        bad = tinker.ServiceClient(base_url=server.base_url,
                                   api_key="tml-wrong-0123456789abcdef")
        bad.create_lora_training_client(base_model=str(server.tokenizer_dir),
                                        rank=4).result()

    t0 = time.monotonic()
    with ThreadPoolExecutor(1) as pool, pytest.raises(Exception) as err:
        pool.submit(wrong).result(timeout=60)
    assert "401" in str(err.value) or "API-Key" in str(err.value)
    assert time.monotonic() - t0 < 60


def test_a_key_is_optional_on_loopback(tmp_path: Path) -> None:
    with running_server(tmp_path) as srv:
        r = httpx.post(f"{srv.base_url}/api/v1/client/config", json={})
        assert r.status_code == 200
