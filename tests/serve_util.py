"""Start `rlscope serve` in-process on a free loopback port (for tests/test_serve_*.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Server:
    base_url: str
    root: Path
    tokenizer_dir: Path
    app: Any


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_server(tmp: Path, **overrides: Any) -> Iterator[Server]:
    """A server on 127.0.0.1 with the tiny model; its tokenizer directory is
    ``tmp/models/tiny-tok`` (three path levels, so the SDK's name heuristics leave it alone)."""
    import uvicorn

    from rlscope.serve.app import create_app
    from rlscope.serve.config import ServeConfig

    os.environ.setdefault("TINKER_API_KEY", "tml-local")
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    tok = tmp / "models" / "tiny-tok"
    # RLSCOPE_SERVE_TEST_DEVICE=cuda reruns the same tests on a GPU
    device = os.environ.get("RLSCOPE_SERVE_TEST_DEVICE", "cpu")
    settings: dict[str, Any] = {"root": str(tmp / "serve_runs"), "write_tokenizer": str(tok),
                                "device": device, "port": free_port(), "log_level": "warning"}
    settings.update(overrides)
    cfg = ServeConfig(**settings)
    app = create_app(cfg)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=cfg.port,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (server.started and app.state.warm.is_set()):
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    try:
        yield Server(f"http://127.0.0.1:{cfg.port}", Path(cfg.root), tok, app)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@dataclass
class ServerProcess:
    base_url: str
    root: Path
    tokenizer_dir: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def peak_rss_bytes(self) -> int:
        """The server process's peak resident memory so far (``VmHWM``)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM in /proc/<pid>/status")


@contextlib.contextmanager
def server_process(tmp: Path, *flags: str, api_key: str = "") -> Iterator[ServerProcess]:
    """``rlscope serve`` as a child process (for memory, signal and shutdown tests)."""
    import httpx

    port = free_port()
    tok = tmp / "models" / "tiny-tok"
    root = tmp / "serve_runs"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RLSCOPE_SERVE_API_KEY", None)
    cmd = [sys.executable, "-c", "import sys; from rlscope.cli import main; "
           "sys.exit(main(sys.argv[1:]))", "serve", "--port", str(port), "--root", str(root),
           "--write_tokenizer", str(tok), "--device", "cpu", "--log_level", "warning", *flags]
    if api_key:
        cmd += ["--api_key", api_key]
    log = tmp / "server.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/api/v1/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the server did not start")
        time.sleep(0.1)
    try:
        yield ServerProcess(url, root, tok, proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def plant_hf_dataset(hf_home: Path, repo_id: str, config: str,
                     splits: dict[str, dict[str, list[Any]]]) -> Path:
    """A synthetic data set in the `datasets` cache of ``hf_home`` (``HF_HOME``), as
    ``datasets.load_dataset(repo_id, config)`` finds it offline (``HF_HUB_OFFLINE=1``: "Using
    the latest cached version"): built by datasets' own parquet builder from ``splits``
    (split → column → values), then moved to ``datasets/<org>___<name>/<config>/``, where the
    offline loader looks. For running unmodified recipes that load a hub data set, with no
    network; the content is whatever the test gives."""
    import shutil
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.packaged_modules.parquet.parquet import Parquet

    org, name = repo_id.split("/")
    cache = hf_home / "datasets"
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for split, columns in splits.items():
            path = Path(tmp) / f"{split}.parquet"
            pq.write_table(pa.table(columns), path)
            files[split] = [str(path)]
        builder = Parquet(cache_dir=str(Path(tmp) / "cache"), dataset_name=name,
                          config_name=config, data_files=files, hash="0" * 16)
        builder.download_and_prepare()
        built = Path(builder.cache_dir)  # .../<name>/<config>-<hash>/<version>/<hash>
        target = cache / f"{org}___{name}" / config / built.parent.name / built.name
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(built, target)
    return target
