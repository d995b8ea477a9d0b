"""Joining or starting a Ray cluster for rlscope (the optional ``ray`` extra).

`ray_cluster` is a context: it reuses the cluster this process is already connected to (a run
inside a Ray sweep task), or joins the one at ``address`` or ``RAY_ADDRESS`` (left running
afterwards), or starts a local one that it shuts down on exit. A local cluster's workers
import the rlscope this process runs (its ``src`` folder goes first on their ``PYTHONPATH``),
as the process backend's workers do.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

INSTALL_HINT = "pip install -e '.[ray]' (or pip install 'ray>=2.40')"


def import_ray(what: str) -> ModuleType:
    """The ``ray`` module, or ValueError naming ``what`` needs it and how to install it."""
    try:
        import ray
    except ImportError:
        raise ValueError(f"{what} needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def ray_missing(what: str) -> str:
    """Why ``what`` cannot use Ray here ("" when ray imports)."""
    try:
        import_ray(what)
    except ValueError as e:
        return str(e)
    return ""


@contextmanager
def ray_cluster(address: str = "", num_cpus: int | None = None) -> Iterator[ModuleType]:
    """Connect to Ray for the duration of the block and yield the module: an already
    initialised connection is used as it is; ``address`` (else ``RAY_ADDRESS``) joins an
    existing cluster (``auto``, ``ray://host:10001`` or ``host:6379``), not shut down after;
    otherwise a local cluster with
    ``num_cpus`` (default: all cores) starts and is shut down at the end."""
    ray = import_ray("--backend ray and --env_workers")
    if ray.is_initialized():
        yield ray
        return
    address = address or os.environ.get("RAY_ADDRESS", "")
    if address:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        try:
            yield ray
        finally:
            ray.shutdown()  # disconnects this driver; the cluster keeps running
        return
    src = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        yield ray
    finally:
        ray.shutdown()
