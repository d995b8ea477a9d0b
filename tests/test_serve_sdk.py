"""The official tinker SDK against `rlscope serve` (TINKER_PROTOCOL.md §5.2): the probe, the
numerical consistency checks, ordering over raw HTTP, chunked forward_backward and errors."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import httpx  # noqa: E402
from serve_util import Server, running_server  # noqa: E402
from tinker import types  # noqa: E402
from tinker.proto import request_conv, response_conv  # noqa: E402

from rlscope.serve.checkpoints import run_key  # noqa: E402
from rlscope.serve.tokenizer_dir import byte_codec  # noqa: E402

PROMPT = "User: What is 3 + 4?\n\nAssistant:"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("serve"), long_poll_s=1.0,
                        fwdbwd_max_chunk_len=3) as srv:
        yield srv


@pytest.fixture(scope="module")
def service(server: Server) -> Iterator[Any]:
    sc = tinker.ServiceClient(base_url=server.base_url, api_key="tml-local")
    yield sc
    sc.close("success")


def _ids(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def _ce_datum(tokens: list[int], n_prompt: int) -> types.Datum:
    """Teacher-forced datum over ``tokens``; weight 1 on the completion's targets."""
    n = len(tokens) - 1
    weights = np.array([0.0] * (n_prompt - 1) + [1.0] * (n - n_prompt + 1), dtype=np.float32)
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": np.array(tokens[1:], dtype=np.int64),
                                       "weights": weights})


def _rl_datum(prompt: list[int], seq: Any, advantage: float) -> types.Datum:
    tokens = prompt + list(seq.tokens)
    pad = [0.0] * (len(prompt) - 1)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": np.array(tokens[1:], dtype=np.int64),
            "logprobs": np.array(pad + list(seq.logprobs), dtype=np.float32),
            "advantages": np.array(pad + [advantage] * len(seq.tokens), dtype=np.float32)})


def _logprobs(out: Any) -> list[np.ndarray]:
    return [o["logprobs"].to_numpy() for o in out.loss_fn_outputs]


def test_sdk_probe(server: Server, service: Any) -> None:
    tc = service.create_lora_training_client(base_model=str(server.tokenizer_dir),
                                             rank=8).result()
    info = tc.get_info()
    _session, kind, seq = info.model_id.split(":")
    assert kind == "train" and seq.isdigit()
    assert info.model_data.model_name == str(server.tokenizer_dir)
    assert info.is_lora and info.lora_rank == 8
    tok = tc.get_tokenizer()
    prompt = _ids(tok, PROMPT)
    model_input = types.ModelInput.from_ints(prompt)

    sampler = tc.save_weights_and_get_sampling_client().result()
    # num_samples in one call, sampled logprobs always present, distinct sequence ids
    res = sampler.sample(model_input, num_samples=3, sampling_params=types.SamplingParams(
        max_tokens=40, stop=[], seed=11)).result()
    assert len(res.sequences) == 3
    assert len({s.sequence_id for s in res.sequences}) == 3
    assert all(isinstance(s.sequence_id, str) for s in res.sequences)
    ref = res.sequences[0]
    assert ref.stop_reason == "length" and len(ref.tokens) == 40
    assert ref.logprobs is not None and len(ref.logprobs) == 40

    # int stop: the same seed replays the same stream, cut at the first occurrence
    stop_tok = ref.tokens[5]
    first = ref.tokens.index(stop_tok)
    cut = sampler.sample(model_input, num_samples=1, sampling_params=types.SamplingParams(
        max_tokens=40, stop=[stop_tok], seed=11)).result().sequences[0]
    assert cut.stop_reason == "stop"
    assert cut.tokens == ref.tokens[:first + 1]
    assert cut.logprobs == pytest.approx(ref.logprobs[:first + 1], abs=1e-5)

    # string stop spanning two tokens: kept once, sampling ends where it completes
    codec = byte_codec()
    i = next(i for i in range(1, 38) if all(33 <= t < 127 for t in ref.tokens[i:i + 2]))
    stop_str = codec.decode(ref.tokens[i:i + 2])
    end = next(k for k in range(1, 41) if stop_str in codec.decode(ref.tokens[:k]))
    cut = sampler.sample(model_input, num_samples=1, sampling_params=types.SamplingParams(
        max_tokens=40, stop=[stop_str], seed=11)).result().sequences[0]
    assert cut.stop_reason == "stop"
    assert cut.tokens == ref.tokens[:end]
    assert codec.decode(cut.tokens).count(stop_str) == 1

    # importance_sampling + optim_step
    before = sampler.compute_logprobs(types.ModelInput.from_ints(prompt + ref.tokens)).result()
    datums = [_rl_datum(prompt, s, a) for s, a in zip(res.sequences, (1.0, -1.0, 0.5),
                                                      strict=True)]
    fb = tc.forward_backward(datums, "importance_sampling").result()
    assert math.isfinite(fb.metrics["loss:sum"])
    assert [len(lp) for lp in _logprobs(fb)] == [len(prompt) + 39] * 3
    opt = tc.optim_step(types.AdamParams(learning_rate=1e-2, grad_clip_norm=1.0)).result()
    assert opt.metrics is not None and opt.metrics["rlscope/grad_norm"] > 0
    assert opt.metrics["rlscope/grad_norm_clipped"] <= 1.0 + 1e-6

    # forward(cross_entropy) and ppo with absolute thresholds
    ce = tc.forward([_ce_datum(prompt + ref.tokens, len(prompt))], "cross_entropy").result()
    assert [len(lp) for lp in _logprobs(ce)] == [len(prompt) + 39]
    assert math.isfinite(ce.metrics["loss:sum"])
    fb = tc.forward_backward(datums[:2], "ppo", {"clip_low_threshold": 0.8,
                                                 "clip_high_threshold": 1.2}).result()
    assert math.isfinite(fb.metrics["loss:sum"])
    assert [len(lp) for lp in _logprobs(fb)] == [len(prompt) + 39] * 2
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()

    # the snapshot taken before the optimizer steps is unchanged after them
    after = sampler.compute_logprobs(types.ModelInput.from_ints(prompt + ref.tokens)).result()
    assert after == before
    assert before[0] is None and len(before) == len(prompt) + 40

    # save_state, save_weights_for_sampler, sample from the saved path
    state = tc.save_state("probe").result()
    assert state.path == f"tinker://{info.model_id}/weights/probe"
    saved = tc.save_weights_for_sampler("probe").result()
    assert saved.path == f"tinker://{info.model_id}/sampler_weights/probe"
    now = tc.forward([_ce_datum(prompt + ref.tokens, len(prompt))], "cross_entropy").result()
    from_path = tc.create_sampling_client(saved.path).result()
    lps = from_path.compute_logprobs(types.ModelInput.from_ints(prompt + ref.tokens)).result()
    np.testing.assert_allclose(np.array(lps[1:], dtype=np.float32), _logprobs(now)[0],
                               atol=1e-4)
    assert not np.allclose(np.array(lps[1:], dtype=np.float32),
                           np.array(before[1:], dtype=np.float32), atol=1e-4)
    run_dir = server.root / run_key(info.model_id)
    assert (run_dir / "checkpoints/weights/probe/adapter/adapter_config.json").is_file()
    assert (run_dir / "checkpoints/weights/probe/adapter/adapter_model.safetensors").is_file()

    # create-from-checkpoint resume: same weights, optimizer restored, a new model id
    tc2 = service.create_training_client_from_state_with_optimizer(state.path).result()
    info2 = tc2.get_info()
    assert info2.model_id != info.model_id and info2.lora_rank == 8
    again = tc2.forward([_ce_datum(prompt + ref.tokens, len(prompt))], "cross_entropy").result()
    np.testing.assert_allclose(_logprobs(again)[0], _logprobs(now)[0], atol=1e-6)
    run = tinker.RestClient(base_url=server.base_url, api_key="tml-local") \
        .get_training_run_by_tinker_path(state.path).result()
    assert run.training_run_id == info.model_id and run.is_lora
    assert run.last_checkpoint is not None and run.last_checkpoint.tinker_path == state.path


def test_sampler_forward_and_compute_logprobs_agree_at_temperature_one(
        server: Server, service: Any) -> None:
    tc = service.create_lora_training_client(base_model=str(server.tokenizer_dir),
                                             rank=4).result()
    tok = tc.get_tokenizer()
    prompt = _ids(tok, PROMPT)
    sampler = tc.save_weights_and_get_sampling_client().result()
    res = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=4,
                         sampling_params=types.SamplingParams(max_tokens=12, stop=[],
                                                              seed=5)).result()
    datums = [_ce_datum(prompt + s.tokens, len(prompt)) for s in res.sequences]
    fwd = _logprobs(tc.forward(datums, "cross_entropy").result())  # 4 datums: 2 chunks
    for seq, lp in zip(res.sequences, fwd, strict=True):
        n = len(seq.tokens)
        np.testing.assert_allclose(lp[-n:], seq.logprobs, atol=1e-4)
        computed = sampler.compute_logprobs(
            types.ModelInput.from_ints(prompt + seq.tokens)).result()
        np.testing.assert_allclose(np.array(computed[-n:], dtype=np.float32), seq.logprobs,
                                   atol=1e-4)
        np.testing.assert_allclose(np.array(computed[1:], dtype=np.float32), lp, atol=1e-4)


def test_concurrent_sample_requests_share_a_decode_batch(server: Server,
                                                         service: Any) -> None:
    tc = service.create_lora_training_client(base_model=str(server.tokenizer_dir),
                                             rank=4).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(_ids(tc.get_tokenizer(), PROMPT))
    params = types.SamplingParams(max_tokens=64, stop=[], seed=3)
    alone = sampler.sample(prompt, num_samples=1, sampling_params=params).result()
    # keep the worker busy with a long decode so the next requests queue up together
    busy = sampler.sample(prompt, num_samples=1, sampling_params=types.SamplingParams(
        max_tokens=1500, stop=[], seed=4))
    time.sleep(0.3)
    futures = [sampler.sample(prompt, num_samples=1, sampling_params=params)
               for _ in range(12)]
    results = [f.result() for f in futures]
    assert len(busy.result().sequences[0].tokens) == 1500
    assert server.app.state.worker.largest_batch > 1
    # a seeded row gets the same tokens whatever batch it shares
    assert all(r.sequences[0].tokens == alone.sequences[0].tokens for r in results)


def test_forward_touches_no_gradients_and_lr_zero_changes_nothing(
        server: Server, service: Any) -> None:
    tc = service.create_lora_training_client(base_model=str(server.tokenizer_dir),
                                             rank=4).result()
    tokens = _ids(tc.get_tokenizer(), PROMPT + " 7\n\nUser:")
    datum = _ce_datum(tokens, 10)
    # make the adapters non-trivial first, so lr 0 is tested on a moved model
    tc.forward_backward([datum], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
    first = _logprobs(tc.forward([datum], "cross_entropy").result())[0]
    second = _logprobs(tc.forward([datum], "cross_entropy").result())[0]
    np.testing.assert_array_equal(first, second)
    opt = tc.optim_step(types.AdamParams(learning_rate=0.0)).result()
    assert opt.metrics is not None and opt.metrics["rlscope/grad_norm"] == 0.0
    third = _logprobs(tc.forward([datum], "cross_entropy").result())[0]
    np.testing.assert_array_equal(first, third)


def test_chunked_forward_backward_equals_the_sum_of_its_datums(
        server: Server, service: Any) -> None:
    tc = service.create_lora_training_client(base_model=str(server.tokenizer_dir),
                                             rank=4).result()
    tok = tc.get_tokenizer()
    datums = [_ce_datum(_ids(tok, f"User: {a} + {b}?\n\nAssistant: {a + b}"), 8)
              for a, b in [(1, 2), (10, 20), (3, 3), (7, 8), (40, 2), (5, 55), (9, 9)]]
    # 7 datums with fwdbwd_max_chunk_len=3: 3 chunks posted concurrently, first chunk last
    whole = tc.forward_backward(datums, "cross_entropy").result()
    singles = [tc.forward([d], "cross_entropy").result() for d in datums]
    assert whole.metrics["loss:sum"] == pytest.approx(
        sum(s.metrics["loss:sum"] for s in singles), rel=1e-5)
    for got, single in zip(_logprobs(whole), singles, strict=True):
        np.testing.assert_allclose(got, _logprobs(single)[0], atol=1e-5)


def test_a_local_hugging_face_model_directory_serves_as_base_model(
        server: Server, service: Any, tmp_path: Path) -> None:
    from rlscope.policy.hf import tiny_hf_model
    from rlscope.serve.tokenizer_dir import VOCAB_SIZE, write_tokenizer_dir

    model_dir = tmp_path / "models" / "hf-qwen2"
    tiny_hf_model("qwen2", VOCAB_SIZE, seed=7, hidden_size=32, num_heads=2,
                  max_len=256).save_pretrained(str(model_dir))
    write_tokenizer_dir(model_dir)  # its tokenizer; config.json makes it a HF model dir
    tc = service.create_lora_training_client(base_model=str(model_dir), rank=2).result()
    assert tc.get_info().model_data.arch == "PeftModel"
    tok = tc.get_tokenizer()
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = _ids(tok, PROMPT)
    seq = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=1,
                         sampling_params=types.SamplingParams(max_tokens=5, stop=[],
                                                              seed=1)).result().sequences[0]
    lp = _logprobs(tc.forward([_ce_datum(prompt + seq.tokens, len(prompt))],
                              "cross_entropy").result())[0]
    np.testing.assert_allclose(lp[-5:], seq.logprobs, atol=1e-4)


def test_errors_are_request_failed_with_category_user(server: Server, service: Any) -> None:
    tc = service.create_lora_training_client(base_model=str(server.tokenizer_dir),
                                             rank=4).result()
    datum = _ce_datum(_ids(tc.get_tokenizer(), PROMPT), 5)
    with pytest.raises(tinker.RequestFailedError) as err:
        tc.forward_backward([datum], "no_such_loss").result()  # type: ignore[arg-type]
    assert err.value.category == types.RequestErrorCategory.User
    assert "unknown loss_fn" in str(err.value)
    short = types.Datum(model_input=datum.model_input, loss_fn_inputs={
        "target_tokens": np.array([1, 2], dtype=np.int64)})
    with pytest.raises(tinker.RequestFailedError) as err:
        tc.forward_backward([short], "cross_entropy").result()
    assert err.value.category == types.RequestErrorCategory.User
    with pytest.raises(tinker.RequestFailedError) as err:
        service.create_lora_training_client(base_model="no/such-model", rank=4).result()
    assert err.value.category == types.RequestErrorCategory.User


# ---------------------------------------------------------------------- raw HTTP ordering


def _retrieve(client: httpx.Client, request_id: str, want_proto: bool) -> httpx.Response:
    headers = {"Accept": "application/x-protobuf" if want_proto else "application/json"}
    for _ in range(60):
        r = client.post("/api/v1/retrieve_future", json={"request_id": request_id,
                                                         "allow_metadata_only": False},
                        headers=headers)
        if r.status_code != 408:
            return r
    raise AssertionError(f"request {request_id} never finished")


def _fwdbwd_body(model_id: str, seq_id: int, datum: types.Datum, forward_only: bool) -> bytes:
    req = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum],
                                                          loss_fn="cross_entropy"),
        model_id=model_id, seq_id=seq_id)
    msg = request_conv.forward_backward_request_to_proto(req)
    msg.forward_only = forward_only
    return bytes(msg.SerializeToString())


def test_out_of_order_and_duplicated_seq_ids_run_in_order(server: Server) -> None:
    proto = {"Content-Type": "application/x-protobuf"}
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        sid = client.post("/api/v1/create_session", json={
            "tags": [], "user_metadata": {}, "sdk_version": "0.38.0",
            "type": "create_session"}).json()["session_id"]
        fut = client.post("/api/v1/create_model", json={
            "session_id": sid, "model_seq_id": 0, "base_model": str(server.tokenizer_dir),
            "lora_config": {"rank": 4}, "type": "create_model"}).json()
        model_id = _retrieve(client, fut["request_id"], False).json()["model_id"]
        assert model_id == f"{sid}:train:0"
        datum = _ce_datum(list(PROMPT.encode()), 10)
        body3 = _fwdbwd_body(model_id, 3, datum, forward_only=True)
        r3 = client.post("/api/v1/forward_backward", content=body3,
                         headers=proto).json()["request_id"]
        optim = {"model_id": model_id, "seq_id": 2, "type": "optim_step",
                 "adam_params": {"learning_rate": 0.1, "beta1": 0.9, "beta2": 0.95,
                                 "eps": 1e-8, "weight_decay": 0.0, "grad_clip_norm": 0.0}}
        r2 = client.post("/api/v1/optim_step", json=optim).json()["request_id"]
        t0 = time.monotonic()
        waiting = client.post("/api/v1/retrieve_future", json={"request_id": r3},
                              headers={"Accept": "application/x-protobuf"})
        assert waiting.status_code == 408  # seq 1 has not arrived: held, then 408
        assert 0.5 < time.monotonic() - t0 < 10
        body1 = _fwdbwd_body(model_id, 1, datum, forward_only=False)
        r1 = client.post("/api/v1/forward_backward", content=body1,
                         headers=proto).json()["request_id"]
        dup = client.post("/api/v1/forward_backward", content=body1,
                          headers=proto).json()["request_id"]
        assert dup == r1  # a retry of (model_id, 1) is the same request
        other = client.post("/api/v1/forward_backward", headers=proto,
                            content=_fwdbwd_body(model_id, 1, datum, forward_only=True))
        failed = _retrieve(client, other.json()["request_id"], True).json()
        assert failed["category"] == "user"
        out1 = response_conv.deserialize_forward_backward_output(
            _retrieve(client, r1, True).content)
        assert _retrieve(client, r2, False).json()["metrics"]["rlscope/grad_norm"] > 0
        out3 = response_conv.deserialize_forward_backward_output(
            _retrieve(client, r3, True).content)
        lp1, lp3 = _logprobs(out1)[0], _logprobs(out3)[0]
        # seq 3 ran after the optimizer step of seq 2, which ran after seq 1's gradients
        assert np.abs(lp3 - lp1).max() > 1e-3
        gone = client.post("/api/v1/retrieve_future", json={"request_id": "999999"}).json()
        assert gone["category"] == "user"
