"""`rlscope serve`: a local server that speaks the Tinker wire protocol (SDK 0.38.0).

The official ``tinker`` SDK and unmodified ``tinker-cookbook`` recipes drive rlscope policies
through it (docs/tinker.md). Modules:

- `config`: `ServeConfig`, the command's options;
- `wire`: protobuf and JSON conversions, built on the SDK's own ``tinker_public_pb2``;
- `losses`: Tinker's loss functions (summed, never normalised) as pure functions;
- `futures`: the request registry, ``seq_id`` ordering with retry deduplication, long polls;
- `state`: training clients, sampler snapshots, model building (LoRA via PEFT), step metrics;
- `sampling`: batched sampling with token and string stops, prompt log-probs;
- `checkpoints`: ``tinker://`` paths, checkpoint directories, training-run records;
- `validate`: typed fields of JSON bodies (400 naming the field, never a 500);
- `engine`: every model operation; `worker`: the thread that runs them from a fair queue
  (round-robin across clients, sample requests in chunks), batching samples;
- `tokenizer_dir`: the tiny models' byte-level tokenizer as a Hugging Face directory;
- `app`: the FastAPI application (lifespan, guard, routers); `context`: what every endpoint
  shares (engine, futures, orderer, worker); `http`: the HTTP edge (API key, body and
  decompression caps, errors to status codes); `routes`: one router per endpoint family;
- `command`: the ``rlscope serve`` entry point (graceful shutdown on SIGTERM).

Nothing here is imported by the rest of the package, so ``fastapi``, ``uvicorn`` and ``tinker``
stay optional (the ``serve`` extra).
"""
