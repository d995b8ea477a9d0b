"""Wire conversions of the Tinker protocol, built on the SDK's own protobuf module.

``forward_backward`` requests arrive as ``tinker_public.ForwardBackwardRequest`` protobuf;
``ForwardBackwardOutput`` and ``SampleResponse`` results leave as protobuf; everything else is
JSON (TINKER_PROTOCOL.md §2). The schema is imported from ``tinker.proto.tinker_public_pb2``
(the installed SDK), never re-declared here, so a schema change in a new SDK shows up as an
import or field error instead of silent corruption.

Layouts (all little-endian): token ids in ``EncodedTextChunk.tokens`` are int32; dense tensors
are in their declared dtype; a ``BatchedTensor`` holds every datum's array back to back with
``N + 1`` int64 *byte* offsets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

_DTYPE_TO_NUMPY: dict[int, np.dtype[Any]] = {
    pb.DTYPE_FLOAT32: np.dtype("<f4"),
    pb.DTYPE_INT64: np.dtype("<i8"),
    pb.DTYPE_INT32: np.dtype("<i4"),
}


class WireError(ValueError):
    """A request body the server cannot decode (reported to the client as a user error)."""


@dataclass(frozen=True)
class WireDatum:
    """One decoded ``Datum``: the flattened model input and its loss inputs (1-D arrays)."""

    tokens: list[int]
    """Token ids of every ``encoded_text`` chunk, concatenated in order."""
    inputs: dict[str, np.ndarray]
    """``loss_fn_inputs`` by name: float32 or int64 arrays, flattened."""
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Declared shape of each input (empty when the client sent none)."""


@dataclass(frozen=True)
class WireForwardBackward:
    """A decoded ``ForwardBackwardRequest``."""

    model_id: str
    seq_id: int
    """Training sequence number; 0 means unset."""
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    """``loss_fn_config_v2`` when present (numbers and strings), else the legacy number map."""
    forward_only: bool
    data: list[WireDatum]


@dataclass(frozen=True)
class SampledSequenceOut:
    """One sampled continuation as the server returns it."""

    tokens: list[int]
    logprobs: list[float]
    """Log-prob of each sampled token (same length as ``tokens``)."""
    stop_reason: str
    """``"stop"`` (a stop token or string ended it) or ``"length"`` (max_tokens)."""


MAX_CSR_DENSE_ELEMENTS = 2**25
"""Most elements the sparse CSR tensors of one request may declare together (they are
densified on arrival; a few bytes of CSR must not turn into gigabytes)."""

SPARSE_KEYS = ("target_tokens", "weights")
"""The only inputs the SDK sends as sparse CSR (2-D top-k targets and their weights)."""


def _csr_to_dense(msg: Any, name: str, budget: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """A 2-D sparse CSR tensor as a dense array (absent cells 0, as the SDK's default
    ``pad_value``); every index is checked, and the shape against the request's remaining
    ``budget`` of dense elements, before anything is allocated."""
    shape = tuple(int(s) for s in msg.shape)
    if name not in SPARSE_KEYS:
        raise WireError(f"loss_fn_inputs[{name!r}]: only {' and '.join(SPARSE_KEYS)} may be "
                        "sparse")
    if len(shape) != 2 or min(shape) < 0:
        raise WireError(f"loss_fn_inputs[{name!r}]: a sparse tensor needs a 2-D shape, got "
                        f"{list(shape)}")
    if math.prod(shape) > budget:
        raise WireError(f"loss_fn_inputs[{name!r}]: the sparse tensors of one request may "
                        f"hold at most {MAX_CSR_DENSE_ELEMENTS} elements in all; send fewer "
                        "datums per request")
    if msg.dtype not in _DTYPE_TO_NUMPY:
        raise WireError(f"loss_fn_inputs[{name!r}]: unsupported sparse dtype enum {msg.dtype}")
    csr = msg.sparse_csr
    dtype = _DTYPE_TO_NUMPY[msg.dtype]
    if len(csr.values) % dtype.itemsize or len(csr.crow_indices) % 8 \
            or len(csr.col_indices) % 8:
        raise WireError(f"loss_fn_inputs[{name!r}]: sparse buffers of the wrong byte length")
    values = np.frombuffer(csr.values, dtype=dtype)
    crow = np.frombuffer(csr.crow_indices, dtype="<i8")
    col = np.frombuffer(csr.col_indices, dtype="<i8")
    rows, cols = shape
    if len(crow) != rows + 1 or len(col) != len(values) or (len(crow) and crow[0] != 0) \
            or (len(crow) and crow[-1] != len(values)) or bool((np.diff(crow) < 0).any()) \
            or bool(((col < 0) | (col >= cols)).any()):
        raise WireError(f"loss_fn_inputs[{name!r}]: inconsistent sparse CSR indices for shape "
                        f"{list(shape)}")
    dense = np.zeros(shape, dtype=dtype)
    row_of = np.repeat(np.arange(rows), np.diff(crow))
    dense[row_of, col] = values
    return dense, shape


def _tensor_from_proto(msg: Any, name: str, budget: int = MAX_CSR_DENSE_ELEMENTS
                       ) -> tuple[np.ndarray, tuple[int, ...]]:
    if msg.HasField("sparse_csr"):
        dense, shape = _csr_to_dense(msg, name, budget)
        out = dense.astype(np.int64) if dense.dtype.kind == "i" else dense.astype(np.float32)
        return out.reshape(-1), shape
    if msg.dtype == pb.DTYPE_BFLOAT16:
        raw = np.frombuffer(msg.dense, dtype="<u2")
        arr: np.ndarray = (raw.astype(np.uint32) << 16).view(np.float32)
    elif msg.dtype in _DTYPE_TO_NUMPY:
        np_dtype = _DTYPE_TO_NUMPY[msg.dtype]
        if len(msg.dense) % np_dtype.itemsize:
            raise WireError(f"loss_fn_inputs[{name!r}]: {len(msg.dense)} bytes is not a "
                            f"multiple of {np_dtype.itemsize}")
        arr = np.frombuffer(msg.dense, dtype=np_dtype)
    else:
        raise WireError(f"loss_fn_inputs[{name!r}]: unsupported dtype enum {msg.dtype}")
    arr = arr.astype(np.int64) if arr.dtype.kind == "i" else arr.astype(np.float32)
    shape = tuple(int(s) for s in msg.shape)
    if shape and math.prod(shape) != arr.size:
        raise WireError(f"loss_fn_inputs[{name!r}]: shape {list(shape)} does not match "
                        f"{arr.size} elements")
    return arr, shape


def decode_forward_backward(body: bytes) -> WireForwardBackward:
    """Parse a protobuf ``ForwardBackwardRequest`` body; raises `WireError` on bad input."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:  # protobuf raises its own DecodeError
        raise WireError(f"forward_backward body is not a ForwardBackwardRequest protobuf: "
                        f"{e}") from e
    config: dict[str, float | str] = {}
    if msg.loss_fn_config_v2:
        for key, value in msg.loss_fn_config_v2.items():
            which = value.WhichOneof("value")
            config[key] = value.text if which == "text" else float(value.number)
    else:
        config = {k: float(v) for k, v in msg.loss_fn_config.items()}
    data = []
    sparse_budget = MAX_CSR_DENSE_ELEMENTS
    for i, datum in enumerate(msg.data):
        tokens: list[int] = []
        for chunk in datum.model_input:
            kind = chunk.WhichOneof("chunk")
            if kind != "encoded_text":
                raise WireError(f"datum {i}: {kind} chunks are not supported (text only)")
            tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype="<i4").tolist())
        inputs: dict[str, np.ndarray] = {}
        shapes: dict[str, tuple[int, ...]] = {}
        for name, tensor in datum.loss_fn_inputs.items():
            inputs[name], shapes[name] = _tensor_from_proto(tensor, name, sparse_budget)
            if tensor.HasField("sparse_csr"):
                sparse_budget -= inputs[name].size
        data.append(WireDatum(tokens=tokens, inputs=inputs, shapes=shapes))
    return WireForwardBackward(model_id=msg.model_id, seq_id=int(msg.seq_id),
                               loss_fn=msg.loss_fn, loss_fn_config=config,
                               forward_only=bool(msg.forward_only), data=data)


def _bf16_bytes(arr: np.ndarray) -> bytes:
    """float32 → bfloat16 bytes, rounding to nearest even (NaN stays NaN)."""
    bits = np.ascontiguousarray(arr, dtype="<f4").view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(arr)
    rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded.astype("<u2").tobytes()


def encode_forward_backward_output(outputs: Sequence[Mapping[str, np.ndarray]],
                                   metrics: Mapping[str, float],
                                   float_dtype: str = "float32") -> bytes:
    """A ``ForwardBackwardOutput`` protobuf: one ``ArrayRecord`` holding every datum.

    ``outputs[i]`` maps field names (e.g. ``"logprobs"``) to arrays of datum ``i``: 1-D, or
    2-D ``[N, K]`` with the same ``K`` for every datum (sent with ``trailing_shape [K]``); every
    datum must carry the same fields. Float arrays go out as ``float_dtype`` (``float32``, or
    ``bfloat16``, which the SDK widens back), integer arrays as int64. Metric keys must read
    ``name:reduction``.
    """
    if float_dtype not in ("float32", "bfloat16"):
        raise ValueError(f"float_dtype must be float32 or bfloat16, got {float_dtype!r}")
    for key in metrics:
        if key.count(":") != 1:
            raise ValueError(f"metric key {key!r} must read name:reduction (one colon)")
    msg = pb.ForwardBackwardOutput()
    msg.loss_fn_output_type = "ArrayRecord"
    for key, value in metrics.items():
        msg.metrics[key] = float(value)
    if not outputs:
        return bytes(msg.SerializeToString())
    names = list(outputs[0])
    for i, out in enumerate(outputs):
        if set(out) != set(names):
            raise ValueError(f"datum {i} has fields {sorted(out)}, datum 0 has {sorted(names)}")
    record = msg.loss_fn_outputs.add()
    record.type_tag = "ArrayRecord"
    record.num_datums = len(outputs)
    for name in names:
        raw = [np.asarray(out[name]) for out in outputs]
        trailing = {a.shape[1:] for a in raw}
        if len(trailing) != 1 or len(next(iter(trailing))) > 1:
            raise ValueError(f"field {name!r}: datums must be all 1-D or all [N, K] with one K, "
                             f"got trailing shapes {sorted(trailing)}")
        arrays = [a.reshape(-1) for a in raw]
        integer = all(a.dtype.kind in "iub" for a in arrays)
        parts: list[bytes] = []
        if integer:
            parts = [a.astype("<i8").tobytes() for a in arrays]
            dtype = pb.DTYPE_INT64
        elif float_dtype == "bfloat16":
            parts = [_bf16_bytes(a.astype(np.float32)) for a in arrays]
            dtype = pb.DTYPE_BFLOAT16
        else:
            parts = [a.astype("<f4").tobytes() for a in arrays]
            dtype = pb.DTYPE_FLOAT32
        offsets = np.cumsum([0] + [len(p) for p in parts]).astype("<i8")
        bt = record.fields[name]
        bt.data = b"".join(parts)
        bt.offsets = offsets.tobytes()
        bt.dtype = dtype
        bt.trailing_shape.extend(next(iter(trailing)))
    return bytes(msg.SerializeToString())


def encode_sample_response(sequences: Sequence[SampledSequenceOut],
                           prompt_logprobs: Sequence[float] | None = None,
                           topk_ids: Sequence[Sequence[int]] | None = None,
                           topk_logprobs: Sequence[Sequence[float]] | None = None) -> bytes:
    """A ``SampleResponse`` protobuf. ``prompt_logprobs`` (NaN where unscored, always at 0)
    is sent only when given; sampled log-probs are always sent. ``topk_ids`` /
    ``topk_logprobs`` (one row of ``k`` per prompt position; empty cells token 0 with
    log-prob −99999) become ``topk_prompt_logprobs``: two row-major ``length × k`` matrices,
    int32 and float32."""
    msg = pb.SampleResponse()
    for seq in sequences:
        if len(seq.tokens) != len(seq.logprobs):
            raise ValueError(f"{len(seq.tokens)} tokens but {len(seq.logprobs)} logprobs")
        if seq.stop_reason not in ("stop", "length"):
            raise ValueError(f"stop_reason must be 'stop' or 'length', got {seq.stop_reason!r}")
        out = msg.sequences.add()
        out.stop_reason = pb.STOP_REASON_STOP if seq.stop_reason == "stop" \
            else pb.STOP_REASON_LENGTH
        out.tokens = np.asarray(seq.tokens, dtype="<i4").tobytes()
        out.logprobs = np.asarray(seq.logprobs, dtype="<f4").tobytes()
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, dtype="<f4").tobytes()
    if (topk_ids is None) != (topk_logprobs is None):
        raise ValueError("topk_ids and topk_logprobs come together")
    if topk_ids is not None and topk_logprobs is not None:
        ids_TK = np.asarray(topk_ids, dtype="<i4")
        lps_TK = np.asarray(topk_logprobs, dtype="<f4")
        if ids_TK.ndim != 2 or ids_TK.shape != lps_TK.shape:
            raise ValueError(f"top-k ids {ids_TK.shape} and log-probs {lps_TK.shape} must be "
                             "two matrices of the same shape")
        topk = msg.topk_prompt_logprobs
        topk.length, topk.k = int(ids_TK.shape[0]), int(ids_TK.shape[1])
        topk.token_ids = ids_TK.tobytes()
        topk.logprobs = lps_TK.tobytes()
    return bytes(msg.SerializeToString())


def tokens_from_model_input(model_input: Any) -> list[int]:
    """Token ids of a JSON ``ModelInput`` (``{"chunks": [{"type": "encoded_text", "tokens":
    [...]}, ...]}``), concatenated; raises `WireError` on other chunk types."""
    if not isinstance(model_input, dict) or not isinstance(model_input.get("chunks"), list):
        raise WireError("prompt must be a ModelInput object with a 'chunks' list")
    tokens: list[int] = []
    for i, chunk in enumerate(model_input["chunks"]):
        kind = chunk.get("type", "encoded_text") if isinstance(chunk, dict) else None
        if kind != "encoded_text":
            raise WireError(f"prompt chunk {i}: {kind!r} chunks are not supported (text only)")
        ids = chunk.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise WireError(f"prompt chunk {i}: 'tokens' must be a list of integers")
        tokens.extend(ids)
    return tokens
