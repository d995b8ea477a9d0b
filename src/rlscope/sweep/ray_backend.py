"""The Ray backend of a sweep (``rlscope sweep --backend ray``): each planned run is a Ray task.

The runs to train come from the same plan as with the process backend (`rlscope.sweep.plan`:
skipped runs never reach Ray, resumed and restarted ones are prepared first), and each task runs
the same entry, `rlscope.sweep.runner.execute` (console output to ``<output>/logs/<run>.log``,
an exception a failed outcome). The sweep records and aggregates the outcomes as they arrive,
exactly as with worker processes.

Resources (`resources`): a run asks for ``num_cpus`` = its torch threads (``--threads``, the
manifest's ``threads``, else cores / ``--jobs``, `rlscope.sweep.runner.with_threads`) and
``num_gpus`` = 1 on ``device = "cuda"`` (Ray then shows it its GPU as ``cuda``), 0 on ``cpu``;
``auto`` asks for a GPU when the cluster has any. Every run is submitted at once; Ray runs as
many as the cluster's free CPUs and GPUs fit. A run that no alive node could ever hold (more
CPUs than the largest node has, or a GPU on a cluster without one: `infeasible`) is recorded
failed with what to change, instead of pending for ever. A task is never retried by Ray: a run whose
worker dies is recorded failed, and the next invocation plans it again.

Stopping (Ctrl-C, SIGTERM, SIGHUP, or any exception) cancels every task still pending or
running (``ray.cancel(force=True)`` kills its worker), so the runs in progress are recorded
interrupted and resume on the next invocation.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

from rlscope.ray_cluster import ray_cluster
from rlscope.sweep.manifest import RunSpec
from rlscope.sweep.processes import SweepInterrupted

WAIT_S = 0.2
"""How long the sweep blocks in ``ray.wait`` before it looks at signals again."""


def device_problem(spec: RunSpec) -> str:
    """Why Ray cannot place ``spec`` ("" if it can): a device naming one GPU (``cuda:N``)."""
    device = spec.config.run.device
    if device.startswith("cuda:"):
        return (f"run {spec.run}: device {device!r} names a GPU, but Ray assigns each run its "
                "GPU: use device = \"cuda\" with --backend ray")
    return ""


def resources(spec: RunSpec, cluster_gpus: float) -> dict[str, float]:
    """The Ray resources one run asks for: its threads as CPUs, one GPU on a CUDA device."""
    r = spec.config.run
    device = r.device
    gpus = 1.0 if device == "cuda" or (device == "auto" and cluster_gpus > 0) else 0.0
    return {"num_cpus": float(max(r.threads, 1)), "num_gpus": gpus}


def infeasible(need: dict[str, float], nodes: Sequence[dict[str, float]]) -> str:
    """Why no node of the cluster can ever run a task asking for ``need`` (`resources`), ""
    if one can. ``nodes`` are the alive nodes' total resources (``ray.nodes()``'s
    ``Resources``: ``CPU``, ``GPU``). Ray would leave such a task pending for ever, and the
    sweep with it; a run that cannot fit is recorded failed instead, saying what to change."""
    cpus, gpus = need.get("num_cpus", 1.0), need.get("num_gpus", 0.0)
    if any(n.get("CPU", 0.0) >= cpus and n.get("GPU", 0.0) >= gpus for n in nodes):
        return ""
    if gpus > 0 and not any(n.get("GPU", 0.0) >= gpus for n in nodes):
        return ("it asks for a GPU (device cuda) and no node of the Ray cluster has one: run "
                "it with device = \"cpu\", or join a cluster with GPUs (--address)")
    most = max((n.get("CPU", 0.0) for n in nodes if n.get("GPU", 0.0) >= gpus), default=0.0)
    return (f"it asks for {cpus:g} CPUs (its --threads) and the largest node that fits it has "
            f"{most:g}: lower --threads (or the manifest's threads) to at most {most:g}")


@contextmanager
def _signals() -> Iterator[list[int]]:
    """`rlscope.sweep.processes.stop_on_signals` that also records the signal: Ray turns an
    exception raised by a signal handler during ``ray.wait`` into a plain KeyboardInterrupt,
    which `run_ray` turns back into `SweepInterrupted` with the signal received."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if not received:
            received.append(signum)
            raise SweepInterrupted(signum)

    wanted = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {s: signal.signal(s, handler) for s in wanted}
    try:
        yield received
    finally:
        for s, old in before.items():
            signal.signal(s, old)


def run_ray(tasks: Sequence[tuple[int, RunSpec]], address: str,
            execute: Callable[[RunSpec], Any], failed: Callable[[str, float], Any]
            ) -> Generator[tuple[int, Any], None, None]:
    """Run ``execute(spec)`` (a module-level function, which Ray's workers import) for every
    ``(key, spec)`` as a Ray task on the cluster at ``address`` (a local one when empty); yield
    ``(key, outcome)`` as each ends. A task whose worker dies gives
    ``failed(why, seconds)``. However the iteration ends, every task still out is cancelled and a
    local cluster is shut down."""
    with ray_cluster(address) as ray, _signals() as received:  # after ray.init's handlers
        gpus = float(ray.cluster_resources().get("GPU", 0.0))
        nodes = [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]
        remote = ray.remote(max_retries=0)(execute)
        specs = dict(tasks)
        started = time.perf_counter()
        refs: dict[Any, int] = {}
        refused: list[tuple[int, str]] = []
        for key, spec in tasks:
            need = resources(spec, gpus)
            if why := infeasible(need, nodes):
                refused.append((key, f"run {spec.run} cannot run on this Ray cluster: {why}"))
            else:
                refs[remote.options(**need).remote(spec)] = key
        try:
            for key, why in refused:
                yield key, failed(why, 0.0)
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=WAIT_S)
                for ref in ready:
                    key = refs.pop(ref)
                    try:
                        outcome = ray.get(ref)
                    except Exception as e:  # the worker died (the run's own errors are outcomes)
                        outcome = failed(f"the Ray task of {specs[key].run} failed: "
                                         f"{type(e).__name__}: {e}".splitlines()[0],
                                         time.perf_counter() - started)
                    yield key, outcome
        except KeyboardInterrupt as e:
            if isinstance(e, SweepInterrupted):
                raise
            raise SweepInterrupted(received[0] if received else signal.SIGINT) from None
        finally:
            for ref in refs:
                ray.cancel(ref, force=True)
