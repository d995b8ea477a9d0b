"""Futures and seq_id ordering: out-of-order arrival, retries, conflicts, gaps, long polls."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rlscope.serve.futures import FutureStore, Result, SeqConflictError, SeqOrderer


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
