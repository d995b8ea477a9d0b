"""The routers of `rlscope serve`: every endpoint of TINKER_PROTOCOL.md that the server speaks
is served by exactly one router, the one of its family, and an endpoint works on the parts
injected into it (here a stub engine: no model, no worker started); hostile edge cases the
stub reaches (deep JSON, overflowing numbers, half-written records, retries) answer 4xx."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient

from rlscope.serve import http
from rlscope.serve.app import create_app
from rlscope.serve.checkpoints import run_key
from rlscope.serve.config import ServeConfig
from rlscope.serve.routes import futures, rest, sampling, session, training

FAMILIES = {
    session: {"POST /api/v1/client/config", "POST /api/v1/client/dynamic_config",
              "POST /api/v1/create_session", "POST /api/v1/session_heartbeat",
              "POST /api/v1/telemetry", "POST /api/v1/sessions/{session_id}/finish",
              "GET /api/v1/healthz", "GET /api/v1/get_server_capabilities"},
    futures: {"POST /api/v1/retrieve_future"},
    training: {"POST /api/v1/create_model", "POST /api/v1/get_info",
               "POST /api/v1/forward_backward", "POST /api/v1/forward",
               "POST /api/v1/optim_step", "POST /api/v1/save_weights",
               "POST /api/v1/save_weights_for_sampler", "POST /api/v1/load_weights",
               "POST /api/v1/save_weights_external"},
    sampling: {"POST /api/v1/create_sampling_session", "GET /api/v1/samplers/{sampler_id}",
               "POST /api/v1/asample"},
    rest: {"GET /api/v1/training_runs", "GET /api/v1/training_runs/{run_id}",
           "GET /api/v1/training_runs/{run_id}/checkpoints"},
}
"""Endpoint families, as TINKER_PROTOCOL.md groups them (§1.2-1.3 and §1.5)."""

KEY = "tml-test-0123456789abcdef"


class StubEngine:
    """Just what the endpoints below touch."""

    def __init__(self) -> None:
        self.models: dict[str, Any] = {}

    def capabilities(self) -> list[dict[str, Any]]:
        return [{"model_name": "stub"}]


def _endpoints(paths: dict[str, Any]) -> set[str]:
    """``"METHOD path"`` of an OpenAPI ``paths`` object."""
    return {f"{method.upper()} {path}" for path, ops in paths.items() for method in ops}


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = create_app(ServeConfig(api_key=KEY), engine=StubEngine())  # type: ignore[arg-type]
    return TestClient(app, headers={"X-API-Key": KEY})  # no `with`: no lifespan, no worker


def test_each_endpoint_is_served_by_the_router_of_its_family(client: TestClient) -> None:
    served = _endpoints(client.get("/openapi.json").json()["paths"])
    assert served == set().union(*FAMILIES.values())
    for module, family in FAMILIES.items():
        assert _endpoints(_router_paths(module.router)) == family, module.__name__


def _router_paths(router: Any) -> dict[str, dict[str, Any]]:
    """OpenAPI-shaped ``{path: {method: {}}}`` of ``router``'s routes."""
    out: dict[str, dict[str, Any]] = {}
    for route in router.routes:
        path = route.path.replace(":path}", "}")
        out.setdefault(path, {}).update({m.lower(): {} for m in route.methods})
    return out


def test_endpoints_use_the_injected_engine_and_shared_error_mapping(
        client: TestClient) -> None:
    r = client.get("/api/v1/get_server_capabilities")
    assert r.status_code == 200 and r.json() == {"supported_models": [{"model_name": "stub"}]}
    r = client.post("/api/v1/optim_step", json={"model_id": "nope",
                                                      "adam_params": {"eps": 1e-8}})
    assert r.status_code == 200 and set(r.json()) == {"request_id", "model_id"}
    failed = client.post("/api/v1/retrieve_future", json={"request_id": r.json()["request_id"]})
    assert failed.json() == {"error": "unknown model_id 'nope'", "category": "user"}
    r = client.post("/api/v1/create_session", content=b"[1]")
    assert r.status_code == 400 and r.json() == {"detail": "the request body must be a JSON "
                                                 "object"}
    assert client.post("/api/v1/telemetry", content=b"x", headers={
        "content-encoding": "br"}).status_code == 400
    assert TestClient(client.app).post("/api/v1/telemetry").status_code == 401


def test_deeply_nested_json_is_400(client: TestClient) -> None:
    nested = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    for raw in (nested, b"[" * 100_000):
        r = client.post("/api/v1/create_session", content=raw)
        assert r.status_code == 400 and "JSON object" in r.json()["detail"], r.text


def test_a_float_field_given_an_integer_too_large_for_a_float_is_400(
        client: TestClient) -> None:
    r = client.post("/api/v1/optim_step", content=json.dumps(
        {"model_id": "m", "adam_params": {"learning_rate": 10**400}}))
    assert r.status_code == 400, r.text
    assert r.json()["detail"] == ("field 'learning_rate' must be finite, got an "
                                  "integer too large for a float")


def test_a_lora_seed_outside_torchs_range_is_400(client: TestClient) -> None:
    for seed in (2**64, -(2**63) - 1):
        r = client.post("/api/v1/create_model", json={
            "session_id": "s", "model_seq_id": 0, "base_model": "tiny",
            "lora_config": {"rank": 4, "seed": seed}})
        assert r.status_code == 400, r.text
        assert r.json()["detail"].startswith("field 'seed' must be ")


def test_a_half_written_checkpoint_or_run_record_is_skipped_or_400_not_500(
        tmp_path: Path) -> None:
    engine = StubEngine()
    engine.root = tmp_path  # type: ignore[attr-defined]
    run_dir = tmp_path / run_key("r")
    for name, meta in (("ok", json.dumps({"name": "ok", "time": "t"})), ("half", "")):
        (run_dir / "checkpoints/weights" / name).mkdir(parents=True)
        (run_dir / "checkpoints/weights" / name / "meta.json").write_text(meta)
    (run_dir / "run.json").write_text(json.dumps({"training_run_id": "r"}))
    app = create_app(ServeConfig(), engine=engine)  # type: ignore[arg-type]
    client = TestClient(app, raise_server_exceptions=False)
    r = client.get("/api/v1/training_runs/r/checkpoints")
    assert r.status_code == 200, r.text
    assert [c["checkpoint_id"] for c in r.json()["checkpoints"]] == ["weights/ok"]
    (run_dir / "run.json").write_text('{"training_run_id": ')
    r = client.get("/api/v1/training_runs/r/checkpoints")
    assert r.status_code == 400 and r.json()["detail"] == "training run 'r' is unreadable"


def test_a_retried_create_model_gets_the_first_answer_model_id_included(
        client: TestClient) -> None:
    body = {"session_id": "retry", "model_seq_id": 3, "base_model": "tiny"}
    first = client.post("/api/v1/create_model", json=body)
    again = client.post("/api/v1/create_model", json=body)
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() == {"request_id": first.json()["request_id"],
                                            "model_id": "retry:train:3"}


def test_finishing_a_session_marks_only_its_own_clients(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from rlscope.serve.engine import Engine

    engine = Engine(ServeConfig(root=str(tmp_path)))
    ids = ["a:train:0", "a:train:1:train:0", "a:b:train:0", "ab:train:0"]
    engine.models = {i: SimpleNamespace(model_id=i) for i in ids}  # type: ignore[misc]
    marked: list[str] = []
    monkeypatch.setattr(engine, "_write_status", lambda m, status: marked.append(m.model_id))
    engine.finish_session("a")
    assert marked == ["a:train:0"]


def test_an_endpoint_taking_the_raw_and_the_json_body_reads_it_once(
        client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    decompress = http.decompress
    monkeypatch.setattr(http, "decompress", lambda *a: calls.append(1) or decompress(*a))
    r = client.post("/api/v1/optim_step", json={"model_id": "m", "adam_params": {}})
    assert r.status_code == 200 and calls == [1]


def test_status_json_stays_finished_and_is_written_whole(tmp_path: Path) -> None:
    """The worker (after each step) and the finish handler's thread both write status.json: a
    step already queued when the session ends must not set it back to running, and the file is
    replaced atomically (a reader never sees half of it)."""
    from rlscope.serve.engine import Engine

    engine = Engine(ServeConfig(root=str(tmp_path)))
    model = SimpleNamespace(model_id="s:train:0", run_dir=tmp_path, step=3, finished=False)

    def status() -> dict[str, object]:
        return json.loads((tmp_path / "status.json").read_text())

    engine._write_status(model, "running")  # type: ignore[arg-type]
    assert status() == {"status": "running", "steps": 3, "model_id": "s:train:0"}
    engine._write_status(model, "finished")  # type: ignore[arg-type]
    model.step = 4
    engine._write_status(model, "running")  # type: ignore[arg-type]  # the late step
    assert status() == {"status": "finished", "steps": 4, "model_id": "s:train:0"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]  # no temp file left
