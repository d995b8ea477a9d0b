"""Futures and seq_id ordering: out-of-order arrival, retries, conflicts, gaps, long polls."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from rlscope.serve.futures import (
    FutureStore,
    Result,
    SeqConflictError,
    SeqOrderer,
    StoreFullError,
)

if TYPE_CHECKING:
    from rlscope.serve.sampling import SampledRow
    from rlscope.serve.worker import SampleJob


def test_requests_run_in_seq_order_whatever_the_arrival_order() -> None:
    ran: list[int] = []
    orderer = SeqOrderer()
    for seq in (3, 2, 5, 1, 4):
        orderer.submit("m", seq, f"body{seq}", f"r{seq}", lambda s=seq: ran.append(s))
    assert ran == [1, 2, 3, 4, 5]


def test_models_are_ordered_independently_and_seq_zero_bypasses() -> None:
    ran: list[str] = []
    orderer = SeqOrderer()
    orderer.submit("a", 2, "x", "a2", lambda: ran.append("a2"))
    orderer.submit("b", 1, "x", "b1", lambda: ran.append("b1"))
    orderer.submit("a", 0, "y", "a0", lambda: ran.append("a0"))
    orderer.submit("a", 1, "z", "a1", lambda: ran.append("a1"))
    assert ran == ["b1", "a0", "a1", "a2"]


def test_a_retry_gets_the_original_request_id_and_runs_once() -> None:
    ran: list[int] = []
    orderer = SeqOrderer()
    assert orderer.submit("m", 1, "same", "r1", lambda: ran.append(1)) == "r1"
    assert orderer.lookup("m", 1, "same") == "r1"
    assert orderer.submit("m", 1, "same", "r1-retry", lambda: ran.append(99)) == "r1"
    assert ran == [1]
    with pytest.raises(SeqConflictError):
        orderer.submit("m", 1, "different", "r1b", lambda: ran.append(2))
    with pytest.raises(SeqConflictError):
        orderer.lookup("m", 1, "different")


def test_a_gap_is_skipped_after_the_timeout() -> None:
    ran: list[int] = []
    orderer = SeqOrderer(gap_timeout_s=0.05)
    orderer.submit("m", 2, "b", "r2", lambda: ran.append(2))
    orderer.release_stale()
    assert ran == []
    time.sleep(0.08)
    orderer.release_stale()
    assert ran == [2]
    orderer.submit("m", 1, "a", "r1", lambda: ran.append(1))  # late arrival still runs
    assert ran == [2, 1]


def test_concurrent_submissions_release_each_request_once_in_order() -> None:
    ran: list[int] = []
    lock = threading.Lock()
    orderer = SeqOrderer()

    def post(seq: int) -> None:
        def job() -> None:
            with lock:
                ran.append(seq)
        orderer.submit("m", seq, str(seq), f"r{seq}", job)

    threads = [threading.Thread(target=post, args=(s,)) for s in range(40, 0, -1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert ran == list(range(1, 41))


def test_long_poll_returns_early_or_times_out() -> None:
    store = FutureStore()
    rid = store.create("Sample")
    assert isinstance(rid, str)

    async def scenario() -> tuple[Result | None, Result | None, float]:
        timed_out = await store.wait(rid, 0.05)
        timer = threading.Timer(0.05, store.set_result, (rid, Result(json={"ok": 1})))
        timer.start()
        t0 = time.monotonic()
        got = await store.wait(rid, 5.0)
        return timed_out, got, time.monotonic() - t0

    timed_out, got, waited = asyncio.run(scenario())
    assert timed_out is None
    assert got is not None and got.json == {"ok": 1}
    assert waited < 2.0
    store.set_result(rid, Result.failed("late", "user"))  # first result wins
    assert store.peek(rid) == Result(json={"ok": 1})
    with pytest.raises(KeyError):
        asyncio.run(store.wait("nope", 0.01))


def test_results_are_evicted_after_retrieval_or_ttl_and_the_store_is_bounded() -> None:
    store = FutureStore(ttl_s=0.2, retrieved_ttl_s=0.05, max_entries=3)
    a, b = store.create("Sample"), store.create("Sample")
    store.set_result(a, Result(json={"a": 1}))
    store.set_result(b, Result(json={"b": 1}))
    store.mark_retrieved(a)
    time.sleep(0.08)
    assert store.evict() == 1  # a: retrieved, past its grace
    assert not store.known(a) and store.known(b)
    time.sleep(0.15)
    assert store.evict() == 1  # b: finished, never retrieved, past the TTL
    assert len(store) == 0
    # bounded: pending entries are kept, the oldest finished one makes room
    pending = [store.create("Sample") for _ in range(2)]
    done = store.create("Sample")
    store.set_result(done, Result(json={}))
    newest = store.create("Sample")
    assert not store.known(done) and all(store.known(r) for r in [*pending, newest])
    assert len(store) == 3
    with pytest.raises(StoreFullError):
        store.create("Sample")  # every slot pending: the app answers 429
    assert store.fail_pending("stop") == 3
    assert store.peek(newest) == Result.failed("stop", "server")


class _FakeEngine:
    """The parts of `Engine` the worker uses: its config and a recording sample_batch."""

    def __init__(self, chunk_rows: int, max_rows: int) -> None:
        from rlscope.serve.config import ServeConfig

        self.cfg = ServeConfig(sample_chunk_rows=chunk_rows, max_sample_rows=max_rows)
        self.batches: list[list[tuple[str, int, int]]] = []
        self.gate: threading.Event | None = None

    def sample_batch(self, weights: object, requests: list[dict[str, Any]]
                     ) -> list[tuple[list[SampledRow], None]]:
        from rlscope.serve.sampling import SampledRow

        self.batches.append([(r["tag"], r["row_offset"], r["num_samples"]) for r in requests])
        if self.gate is not None:
            self.gate.wait(10)
        return [([SampledRow([r["row_offset"] + i], [0.0], "length")
                  for i in range(r["num_samples"])], None) for r in requests]


def _sample_job(store: FutureStore, tag: str, n: int, weights: object, client: str) -> SampleJob:
    from rlscope.serve.worker import SampleJob

    request = {"num_samples": n, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
               "prompt_logprobs": False, "tag": tag}
    return SampleJob(store.create("Sample"), weights, request, client)  # type: ignore[arg-type]


def test_a_huge_sample_request_is_chunked_and_does_not_starve_other_clients() -> None:
    pytest.importorskip("tinker")
    from rlscope.serve.worker import Job, Worker

    engine = _FakeEngine(chunk_rows=64, max_rows=128)
    store = FutureStore()
    worker = Worker(engine, store)  # type: ignore[arg-type]
    huge = _sample_job(store, "huge", 1000, object(), "A")
    small = _sample_job(store, "small", 3, object(), "B")
    ran: list[str] = []
    job = Job(store.create("OptimStep"), lambda: ran.append("optim") or Result(json={}), "C")
    worker.put(huge)
    worker.put(small)
    worker.put(job)
    worker.start()
    deadline = time.monotonic() + 10
    while store.peek(huge.request_id) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker.stop(5.0)
    # round-robin: one chunk of A while others wait, then B, then C's training job, then the
    # rest of A, its chunks merged up to max_sample_rows now that nobody else waits
    assert engine.batches[0] == [("huge", 0, 64)]
    assert engine.batches[1] == [("small", 0, 3)]
    assert engine.batches[2] == [("huge", 64, 64), ("huge", 128, 64)]
    assert ran == ["optim"]
    assert sum(n for b in engine.batches for t, _, n in b if t == "huge") == 1000
    assert all(sum(n for _, _, n in b) <= 128 for b in engine.batches)
    out = store.peek(huge.request_id)
    assert out is not None and out.proto is not None
    from tinker.proto import tinker_public_pb2 as pb

    msg = pb.SampleResponse()
    msg.ParseFromString(out.proto)
    firsts = [int(np.frombuffer(s.tokens, dtype="<i4")[0]) for s in msg.sequences]
    assert firsts == list(range(1000))  # chunks reassembled in row order


def test_stop_fails_queued_work_at_once() -> None:
    pytest.importorskip("tinker")
    from rlscope.serve.worker import SHUTDOWN_ERROR, Worker

    engine = _FakeEngine(chunk_rows=8, max_rows=8)
    engine.gate = threading.Event()  # the first batch blocks until released
    store = FutureStore()
    worker = Worker(engine, store)  # type: ignore[arg-type]
    queued = [_sample_job(store, f"r{i}", 8, object(), f"c{i}") for i in range(5)]
    for j in queued:
        worker.put(j)
    worker.start()
    while not engine.batches:
        time.sleep(0.01)
    t0 = time.monotonic()
    assert not worker.stop(0.2)  # the running batch is still blocked: bounded wait
    assert time.monotonic() - t0 < 1.0
    running, rest = queued[0], queued[1:]
    assert store.peek(running.request_id) is None
    assert [store.peek(j.request_id) for j in rest] == [
        Result.failed(SHUTDOWN_ERROR, "server")] * 4
    engine.gate.set()
    assert worker.stop(5.0)
    done = store.peek(running.request_id)
    assert done is not None and done.proto is not None
    assert len(engine.batches) == 1  # nothing queued ran after stop
    late = _sample_job(store, "late", 1, object(), "x")
    worker.put(late)
    assert store.peek(late.request_id) == Result.failed(SHUTDOWN_ERROR, "server")
