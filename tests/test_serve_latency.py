"""No request through the official SDK takes more than a few seconds on the tiny model.

Issue 13 saw supervised recipes stall 45 s on their first step (the SDK's ``retrieve_future``
timeout) while the server had answered in 0.12 s, when the server's ``client/config`` forced
``use_pyqwest_transport: false``; the server now leaves the transport to the SDK. This runs a
short supervised loop the way the cookbook does (pipelined ``forward_backward_async`` +
``optim_step_async``, an evaluation through a sampling client, ``save_state``), after an idle
gap longer than uvicorn's keep-alive timeout (5 s), and times every call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
pytest.importorskip("fastapi")

import httpx  # noqa: E402
from serve_util import Server, running_server  # noqa: E402
from tinker import types  # noqa: E402

SLOWEST_S = 5.0
"""Longest any single call may take (the tiny model answers in well under a second)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("latency")) as srv:
        yield srv


def test_client_config_leaves_the_transport_to_the_sdk(server: Server) -> None:
    out = httpx.post(f"{server.base_url}/api/v1/client/config", json={"sdk_version": "0.38.0"})
    assert out.status_code == 200
    assert "use_pyqwest_transport" not in out.json()
    assert types.ClientConfigResponse(**out.json()).use_pyqwest_transport is True


def test_startup_warm_up_keeps_the_first_create_fast(server: Server, tmp_path: Path) -> None:
    assert server.app.state.warm.is_set()
    service = tinker.ServiceClient(base_url=server.base_url, api_key="tml-local")
    t0 = time.monotonic()
    tc = service.create_lora_training_client(base_model=str(server.tokenizer_dir), rank=4)
    assert tc.result().get_info().lora_rank == 4
    assert time.monotonic() - t0 < SLOWEST_S
    service.close("success")


def _datum(rng: np.random.Generator) -> types.Datum:
    n = int(rng.integers(20, 60))
    tokens = rng.integers(0, 256, n).tolist()
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": np.array(tokens[1:], dtype=np.int64),
                                       "weights": np.ones(n - 1, dtype=np.float32)})


def test_a_supervised_loop_has_no_slow_request(server: Server) -> None:
    timings: list[tuple[str, float]] = []

    async def timed(name: str, coro: Any) -> Any:
        t0 = time.monotonic()
        out = await coro
        timings.append((name, time.monotonic() - t0))
        return out

    async def run() -> None:
        service = tinker.ServiceClient(base_url=server.base_url, api_key="tml-local")
        tc = await timed("create", service.create_lora_training_client_async(
            base_model=str(server.tokenizer_dir), rank=8))
        await asyncio.sleep(5.5)  # idle past uvicorn's keep-alive timeout, as a recipe does
        rng = np.random.default_rng(0)
        pending = None
        for step in range(4):
            batch = [_datum(rng) for _ in range(16)]
            if step % 2 == 0:  # the cookbook's evaluation: a sampler on the current weights
                sampler = await timed("sampler", tc.save_weights_and_get_sampling_client_async())
                prompt = types.ModelInput.from_ints(list(b"User: 2 + 2?\n\nAssistant:"))
                await timed("sample", sampler.sample_async(
                    prompt, num_samples=4, sampling_params=types.SamplingParams(max_tokens=8)))
                await timed("logprobs", sampler.compute_logprobs_async(prompt))
            fb = await timed("submit fb", tc.forward_backward_async(batch, "cross_entropy"))
            opt = await timed("submit optim", tc.optim_step_async(
                types.AdamParams(learning_rate=1e-3)))
            if pending is not None:
                await timed("fb result", pending[0].result_async())
                await timed("optim result", pending[1].result_async())
            pending = (fb, opt)
        assert pending is not None
        await timed("fb result", pending[0].result_async())
        await timed("optim result", pending[1].result_async())
        await timed("save_state", (await tc.save_state_async("final")).result_async())
        service.close("success")

    asyncio.run(run())
    assert len(timings) > 20
    slow = [(name, round(s, 2)) for name, s in timings if s > SLOWEST_S]
    assert not slow, slow
