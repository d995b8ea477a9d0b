"""Protobuf round trips of `rlscope.serve.wire` against the tinker SDK's own converters."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("tinker")

from tinker import types
from tinker.proto import request_conv, response_conv

from rlscope.serve.wire import (
    SampledSequenceOut,
    WireError,
    decode_forward_backward,
    encode_forward_backward_output,
    encode_sample_response,
    tokens_from_model_input,
)


def _request(data: list[types.Datum], loss_fn: str = "ppo",
             config: dict[str, float | str] | None = None, forward_only: bool = False
             ) -> bytes:
    req = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss_fn,
                                                          loss_fn_config=config),
        model_id="s:train:0", seq_id=7)
    msg = request_conv.forward_backward_request_to_proto(req)
    msg.forward_only = forward_only
    return bytes(msg.SerializeToString())


def test_forward_backward_request_decodes_ragged_chunked_datums() -> None:
    d0 = types.Datum(
        model_input=types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1, 2, 3]),
                                             types.EncodedTextChunk(tokens=[300, 5])]),
        loss_fn_inputs={"target_tokens": np.array([2, 3, 300, 5, 9], dtype=np.int64),
                        "logprobs": np.array([0, 0, -1.5, -0.25, -2], dtype=np.float32),
                        "advantages": np.array([0, 0, 1, 1, -0.5], dtype=np.float32)})
    d1 = types.Datum(model_input=types.ModelInput.from_ints([7]),
                     loss_fn_inputs={"target_tokens": np.array([8], dtype=np.int64),
                                     "logprobs": np.array([-0.5], dtype=np.float32),
                                     "advantages": np.array([2.0], dtype=np.float32)})
    req = decode_forward_backward(_request([d0, d1], "ppo", {"clip_low_threshold": 0.8,
                                                             "clip_high_threshold": 1.3}))
    assert (req.model_id, req.seq_id, req.loss_fn, req.forward_only) == \
        ("s:train:0", 7, "ppo", False)
    assert req.loss_fn_config == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.3}
    assert req.data[0].tokens == [1, 2, 3, 300, 5] and req.data[1].tokens == [7]
    assert req.data[0].inputs["target_tokens"].dtype == np.int64
    np.testing.assert_array_equal(req.data[0].inputs["target_tokens"], [2, 3, 300, 5, 9])
    np.testing.assert_array_equal(req.data[0].inputs["advantages"], [0, 0, 1, 1, -0.5])
    assert req.data[1].inputs["logprobs"].tolist() == [-0.5]
    assert req.data[0].shapes["logprobs"] == (5,)


def test_forward_only_flag_and_string_config_survive() -> None:
    datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2]),
                        loss_fn_inputs={"target_tokens": np.array([2, 3], dtype=np.int64)})
    req = decode_forward_backward(_request([datum], "cross_entropy", {"mode": "x", "beta": 2.0},
                                           forward_only=True))
    assert req.forward_only
    assert req.loss_fn_config == {"mode": "x", "beta": 2.0}  # v2 map: strings and numbers


def test_garbage_body_is_a_wire_error() -> None:
    with pytest.raises(WireError):
        decode_forward_backward(b"\xff\xff\xff\xff not a proto")


def test_forward_backward_output_round_trips_ragged_lengths_and_empty_outputs() -> None:
    outputs = [{"logprobs": np.array([-1.0, -2.5, -0.125], dtype=np.float32)},
               {"logprobs": np.array([], dtype=np.float32)},
               {"logprobs": np.array([-3.0], dtype=np.float32)}]
    blob = encode_forward_backward_output(outputs, {"loss:sum": 6.625})
    out = response_conv.deserialize_forward_backward_output(blob)
    assert out.metrics == {"loss:sum": 6.625}
    assert out.loss_fn_output_type == "ArrayRecord"
    assert [o["logprobs"].shape for o in out.loss_fn_outputs] == [[3], [0], [1]]
    assert out.loss_fn_outputs[0]["logprobs"].tolist() == [-1.0, -2.5, -0.125]
    assert out.loss_fn_outputs[0]["logprobs"].dtype == "float32"
    empty = response_conv.deserialize_forward_backward_output(
        encode_forward_backward_output([], {"loss:sum": 0.0}))
    assert empty.loss_fn_outputs == [] and empty.metrics == {"loss:sum": 0.0}


def test_bfloat16_outputs_are_widened_by_the_sdk() -> None:
    values = np.array([-1.0, -0.5, -3.140625, 2.0**-8], dtype=np.float32)  # exact in bf16
    blob = encode_forward_backward_output([{"logprobs": values}], {"loss:sum": 1.0},
                                          float_dtype="bfloat16")
    out = response_conv.deserialize_forward_backward_output(blob)
    td = out.loss_fn_outputs[0]["logprobs"]
    assert td.dtype == "float32"
    np.testing.assert_array_equal(td.to_numpy(), values)
    rounded = response_conv.deserialize_forward_backward_output(encode_forward_backward_output(
        [{"logprobs": np.array([1.0 + 2.0**-10], dtype=np.float32)}], {"loss:sum": 0.0},
        float_dtype="bfloat16"))
    assert rounded.loss_fn_outputs[0]["logprobs"].tolist() == [1.0]


def test_metric_keys_need_one_colon() -> None:
    with pytest.raises(ValueError, match="name:reduction"):
        encode_forward_backward_output([], {"loss": 1.0})


def test_sample_response_round_trips_with_nan_prompt_logprobs() -> None:
    seqs = [SampledSequenceOut([5, 6, 7], [-0.5, -1.0, -1.5], "stop"),
            SampledSequenceOut([9], [-2.0], "length")]
    blob = encode_sample_response(seqs, [math.nan, -1.25, -0.75])
    resp = response_conv.deserialize_sample_response(blob)
    assert [s.stop_reason for s in resp.sequences] == ["stop", "length"]
    assert resp.sequences[0].tokens == [5, 6, 7]
    assert resp.sequences[0].logprobs == [-0.5, -1.0, -1.5]
    assert resp.prompt_logprobs == [None, -1.25, -0.75]


def test_sample_response_without_prompt_logprobs_and_with_an_empty_sequence() -> None:
    blob = encode_sample_response([SampledSequenceOut([], [], "length")])
    resp = response_conv.deserialize_sample_response(blob)
    assert resp.prompt_logprobs is None
    assert resp.sequences[0].tokens == [] and resp.sequences[0].stop_reason == "length"
    with pytest.raises(ValueError, match="stop_reason"):
        encode_sample_response([SampledSequenceOut([1], [-1.0], "eos")])


def test_json_model_input_flattens_chunks() -> None:
    prompt = types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1, 2]),
                                      types.EncodedTextChunk(tokens=[3])])
    assert tokens_from_model_input(prompt.model_dump(mode="json")) == [1, 2, 3]
    with pytest.raises(WireError, match="not supported"):
        tokens_from_model_input({"chunks": [{"type": "image", "data": "", "format": "png"}]})
