"""`rlscope serve` under hostile input (issue 13): a zstd bomb, a gzip bomb, a 100 MB body,
huge ``num_samples`` / ``max_tokens``, wrong types and NaN, colliding model ids, ``tinker://``
path traversal. Each gets a 4xx naming the problem (no traceback, no server path), the server
keeps answering, and its memory (resident size sampled every few ms during the attack) barely
moves. The server runs in this process (fast); the SIGTERM test starts ``rlscope serve`` as a
child process (slow: ~30 s of imports on a shared CPU)."""

from __future__ import annotations

import gzip
import json
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tinker")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import httpx
from serve_util import Server, ServerProcess, running_server, server_process

from rlscope.serve.checkpoints import run_key

MB = 2**20
MAX_GROWTH = 100 * MB
"""Largest rise of the server's peak memory any attack may cause."""


LIMITS = {"max_body_bytes": 8 * MB, "max_decompressed_bytes": 16 * MB, "max_num_samples": 64,
          "max_sample_tokens": 256, "max_batch_tokens": 100000, "long_poll_s": 5.0}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("limits"), **LIMITS) as srv:
        yield srv


class PeakRSS:
    """The largest resident size of this process above its value at entry, sampled every
    2 ms on a thread while the block runs."""

    @staticmethod
    def rss() -> int:
        """Resident bytes of this process (Linux ``/proc/self/statm``)."""
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self) -> PeakRSS:
        self.base = self.rss()
        self.growth = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.growth = max(self.growth, self.rss() - self.base)
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c


def _retrieve(client: httpx.Client, request_id: str) -> dict[str, Any]:
    for _ in range(30):
        r = client.post("/api/v1/retrieve_future", json={"request_id": request_id})
        if r.status_code != 408:
            out: dict[str, Any] = r.json()
            return out
    raise AssertionError(f"request {request_id} never finished")


def _session(client: httpx.Client) -> str:
    sid: str = client.post("/api/v1/create_session", json={
        "tags": [], "user_metadata": {}, "sdk_version": "0.38.0",
        "type": "create_session"}).json()["session_id"]
    return sid


def _model(client: httpx.Client, server: Server, session_id: str) -> str:
    fut = client.post("/api/v1/create_model", json={
        "session_id": session_id, "model_seq_id": 0, "base_model": str(server.tokenizer_dir),
        "lora_config": {"rank": 4}, "type": "create_model"})
    assert fut.status_code == 200, fut.text
    out = _retrieve(client, fut.json()["request_id"])
    assert "model_id" in out, out
    model_id: str = out["model_id"]
    return model_id


@pytest.fixture(scope="module")
def sampler(client: httpx.Client, server: Server) -> str:
    return _base_sampler(client, server)


def _base_sampler(client: httpx.Client, server: Server | ServerProcess) -> str:
    r = client.post("/api/v1/create_sampling_session", json={
        "session_id": _session(client), "sampling_session_seq_id": 0,
        "base_model": str(server.tokenizer_dir), "type": "create_sampling_session"})
    assert r.status_code == 200, r.text
    sid: str = r.json()["sampling_session_id"]
    return sid


def _still_answers(client: httpx.Client, sampler: str) -> None:
    assert client.get("/api/v1/healthz").json() == {"status": "ok"}
    r = client.post("/api/v1/asample", json={
        "sampling_session_id": sampler, "num_samples": 2,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [72, 105]}]},
        "sampling_params": {"max_tokens": 3, "seed": 1}})
    assert r.status_code == 200, r.text
    done = client.post("/api/v1/retrieve_future", json={"request_id": r.json()["request_id"]},
                       headers={"Accept": "application/x-protobuf"})
    assert done.status_code == 200
    assert done.headers["content-type"] == "application/x-protobuf"


def _zstd_bomb(blocks: int) -> bytes:
    """A zstd frame of ``blocks`` RLE blocks of 128 KiB zeros: 4 bytes each, so 65536 blocks
    (256 KiB) inflate to 8 GiB."""
    header = struct.pack("<I", 0xFD2FB528) + bytes([0x00, 0x38])  # no content size, 128 KiB
    block = (128 * 1024) << 3 | 1 << 1  # RLE
    return header + (block.to_bytes(3, "little") + b"\0") * (blocks - 1) \
        + (block | 1).to_bytes(3, "little") + b"\0"


def test_decompression_bombs_are_413_fast_with_bounded_memory(
        server: Server, client: httpx.Client, sampler: str) -> None:
    bomb = _zstd_bomb(65536)
    assert len(bomb) < 300_000  # 256 KiB → 8 GiB
    zipped = gzip.compress(bytes(64 * MB), compresslevel=1)
    with PeakRSS() as mem:
        t0 = time.monotonic()
        r = client.post("/api/v1/forward_backward", content=bomb, headers={
            "Content-Type": "application/x-protobuf", "Content-Encoding": "zstd"})
        assert r.status_code == 413 and "max_decompressed_bytes" in r.json()["detail"]
        assert time.monotonic() - t0 < 10
        r = client.post("/api/v1/optim_step", content=zipped, headers={
            "Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert r.status_code == 413
        r = client.post("/api/v1/forward_backward", content=b"\x28\xb5\x2f\xfd garbage",
                        headers={"Content-Encoding": "zstd"})
        assert r.status_code == 400 and "corrupt" in r.json()["detail"]
    assert mem.growth < MAX_GROWTH, mem.growth
    _still_answers(client, sampler)


def test_oversized_bodies_are_413_with_bounded_memory(
        server: Server, client: httpx.Client, sampler: str) -> None:
    chunk = b"x" * MB

    def chunks() -> Iterator[bytes]:  # 100 MB without a Content-Length: counted as read
        for _ in range(100):
            yield chunk

    with PeakRSS() as mem:
        r = client.post("/api/v1/optim_step", content=chunks())
        assert r.status_code == 413 and "max_body_bytes" in r.json()["detail"]
        r = client.post("/api/v1/telemetry", content=chunks(),  # declared Content-Length
                        headers={"Content-Length": str(100 * MB)})
        assert r.status_code == 413 and "max_body_bytes" in r.json()["detail"]
    assert mem.growth < MAX_GROWTH, mem.growth
    _still_answers(client, sampler)


def test_huge_sample_requests_are_400(client: httpx.Client, sampler: str) -> None:
    prompt = {"chunks": [{"type": "encoded_text", "tokens": [72, 105]}]}
    cases = [({"num_samples": 200000}, "num_samples"),
             ({"num_samples": 1, "sampling_params": {"max_tokens": 100000}}, "max_tokens"),
             ({"num_samples": 64, "sampling_params": {"max_tokens": 256},
               "prompt": {"chunks": [{"type": "encoded_text", "tokens": [65] * 1700}]}},
              "max_batch_tokens")]
    for extra, field in cases:
        t0 = time.monotonic()
        r = client.post("/api/v1/asample", json={
            "sampling_session_id": sampler, "prompt": prompt, **extra})
        assert r.status_code == 400, (extra, r.text)
        assert field in r.json()["detail"]
        assert time.monotonic() - t0 < 5
    _still_answers(client, sampler)


def test_wrong_types_and_non_finite_numbers_are_400_naming_the_field(
        server: Server, client: httpx.Client, sampler: str) -> None:
    sid = _session(client)
    model_id = _model(client, server, sid)
    prompt = {"chunks": [{"type": "encoded_text", "tokens": [72, 105]}]}
    adam = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}
    cases: list[tuple[str, Any, str]] = [
        ("create_model", {"session_id": sid, "model_seq_id": "zero",
                          "base_model": str(server.tokenizer_dir)}, "model_seq_id"),
        ("create_model", {"session_id": sid, "model_seq_id": 3, "base_model": "x",
                          "lora_config": {"rank": "8"}}, "rank"),
        ("create_model", {"session_id": 5, "base_model": "x"}, "session_id"),
        ("create_model", {"session_id": sid, "model_seq_id": 4, "base_model": ["x"]},
         "base_model"),
        ("optim_step", {"model_id": model_id, "seq_id": 1.5, "adam_params": adam}, "seq_id"),
        ("optim_step", {"model_id": model_id, "seq_id": 1,
                        "adam_params": {**adam, "learning_rate": float("nan")}},
         "learning_rate"),
        ("optim_step", {"model_id": model_id, "seq_id": 1,
                        "adam_params": {**adam, "beta1": float("inf")}}, "beta1"),
        ("asample", {"sampling_session_id": sampler, "prompt": prompt,
                     "sampling_params": {"temperature": float("nan")}}, "temperature"),
        ("asample", {"sampling_session_id": sampler, "prompt": prompt,
                     "sampling_params": {"temperature": "hot"}}, "temperature"),
        ("asample", {"sampling_session_id": sampler, "prompt": prompt,
                     "sampling_params": {"top_p": 2.0}}, "top_p"),
        ("asample", {"sampling_session_id": sampler, "prompt": prompt, "num_samples": True},
         "num_samples"),
        ("asample", {"sampling_session_id": sampler, "prompt": "Hi"}, "prompt"),
        ("asample", {"sampling_session_id": sampler, "prompt": prompt,
                     "sampling_params": {"stop": 5}}, "stop"),
        ("retrieve_future", {"request_id": [1]}, "request_id"),
        ("save_weights", {"model_id": model_id, "seq_id": 1, "path": 7}, "path"),
        ("load_weights", {"path": "tinker://a/weights/b", "optimizer": "yes",
                          "session_id": sid}, "optimizer"),
        ("get_info", {"model_id": None}, "model_id"),
    ]
    for endpoint, body, field in cases:
        r = client.post(f"/api/v1/{endpoint}", content=json.dumps(body),  # NaN, Infinity
                        headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (endpoint, body, r.status_code, r.text)
        detail = r.json()["detail"]
        assert field in detail, (endpoint, detail)
        assert "Traceback" not in r.text
    for raw in (b"[1, 2]", b"{not json", b""):
        r = client.post("/api/v1/optim_step", content=raw)
        assert r.status_code == 400 and "JSON object" in r.json()["detail"]
    r = client.post("/api/v1/forward_backward", content=b"\xff" * 64,
                    headers={"Content-Type": "application/x-protobuf"})
    assert r.status_code == 400 and "ForwardBackwardRequest" in r.json()["detail"]
    _still_answers(client, sampler)


def test_colliding_model_ids_get_distinct_directories(server: Server,
                                                      client: httpx.Client) -> None:
    slash = client.post("/api/v1/create_model", json={
        "session_id": "victim/run", "base_model": str(server.tokenizer_dir)})
    assert slash.status_code == 400 and "session_id" in slash.json()["detail"]
    victim = _model(client, server, "victim_run")  # the old directory scheme mapped both
    # "victim_run:train:0" and "victim:run:train:0" to ROOT/victim_run_train_0
    optim = {"model_id": victim, "seq_id": 1, "type": "optim_step",
             "adam_params": {"learning_rate": 0.0}}
    assert "metrics" in _retrieve(client, client.post("/api/v1/optim_step",
                                                      json=optim).json()["request_id"])
    saved = _retrieve(client, client.post("/api/v1/save_weights", json={
        "model_id": victim, "seq_id": 2, "path": "ck"}).json()["request_id"])
    assert saved["path"] == f"tinker://{victim}/weights/ck"
    victim_dir = server.root / run_key(victim)
    metrics = (victim_dir / "metrics.jsonl").read_text()
    ckpt = (victim_dir / "checkpoints/weights/ck/trainable.pt").read_bytes()
    attacker = _model(client, server, "victim:run")
    assert attacker != victim
    attacker_dir = server.root / run_key(attacker)
    assert attacker_dir != victim_dir and (attacker_dir / "config.json").is_file()
    assert (victim_dir / "metrics.jsonl").read_text() == metrics and metrics.strip()
    assert (victim_dir / "checkpoints/weights/ck/trainable.pt").read_bytes() == ckpt
    assert json.loads((victim_dir / "config.json").read_text())["model_id"] == victim
    dirs = {run_key(i) for i in ("a/b", "a:b", "a_b", "a?b", "..", ".", "a/../b")}
    assert len(dirs) == 7 and not any(d.startswith(".") or "/" in d for d in dirs)


def test_tinker_paths_are_confined_to_the_root(server: Server, client: httpx.Client,
                                               sampler: str, tmp_path: Path) -> None:
    sid = _session(client)
    root = str(server.root.resolve())
    bad = ["tinker://../../etc/weights/passwd", "tinker://run/weights/..",
           "tinker://run/weights/../../../x", "tinker://../weights/x", "tinker://./weights/x",
           "file:///etc/passwd", "tinker://run/other/x", "tinker:///weights/x"]
    for i, path in enumerate(bad):
        r = client.post("/api/v1/load_weights", json={
            "path": path, "optimizer": False, "session_id": sid, "model_seq_id": 10 + i})
        assert r.status_code == 400, (path, r.text)
        assert root not in r.text and "checkpoint" in r.json()["detail"]
        r = client.post("/api/v1/create_sampling_session", json={"model_path": path})
        assert r.status_code == 400 and root not in r.text
        r = client.post("/api/v1/asample", json={
            "model_path": path, "prompt": {"chunks": [{"type": "encoded_text",
                                                       "tokens": [1]}]}})
        assert r.status_code == 400 and root not in r.text
    missing = client.post("/api/v1/create_sampling_session",
                          json={"model_path": "tinker://nobody/weights/x"})
    assert missing.status_code == 400 and "no checkpoint at tinker://" in missing.text
    assert root not in missing.text and str(server.root) not in missing.text
    r = client.get("/api/v1/training_runs/..%2F..%2Fetc")
    assert r.status_code in (400, 404) and root not in r.text
    assert not (server.root.parent / "etc").exists()
    _still_answers(client, sampler)


@pytest.mark.slow
def test_sigterm_with_queued_jobs_fails_them_and_exits_within_the_bound(
        tmp_path: Path) -> None:
    with server_process(tmp_path, "--long_poll_s", "5", "--shutdown_timeout_s", "6") as srv:
        with httpx.Client(base_url=srv.base_url, timeout=60) as client:
            _sigterm(srv, client, _base_sampler(client, srv))


def _sigterm(server: ServerProcess, client: httpx.Client, sampler: str) -> None:
    prompt = {"chunks": [{"type": "encoded_text", "tokens": [72, 105]}]}
    ids = []
    for i in range(40):  # minutes of decoding on this CPU
        r = client.post("/api/v1/asample", json={
            "sampling_session_id": sampler, "prompt": prompt, "num_samples": 64,
            "sampling_params": {"max_tokens": 256, "stop": [], "temperature": 1.0 + i / 100}})
        assert r.status_code == 200, r.text
        ids.append(r.json()["request_id"])
    polled: list[httpx.Response] = []

    def poll() -> None:
        with httpx.Client(base_url=server.base_url, timeout=30) as c:
            polled.append(c.post("/api/v1/retrieve_future", json={"request_id": ids[-1]}))

    import threading

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    server.proc.terminate()  # SIGTERM
    server.proc.wait(timeout=20)
    took = time.monotonic() - t0
    poller.join(timeout=20)
    assert took < 6 + 3, took  # --shutdown_timeout_s 6
    assert polled and polled[0].status_code == 200
    assert "shutting down" in polled[0].json()["error"]
    assert polled[0].json()["category"] == "server"
