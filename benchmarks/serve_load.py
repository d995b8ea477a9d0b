"""Load test of `rlscope serve`: N concurrent official-SDK clients, latency per request kind
and the server's peak memory, printed as JSON.

    python benchmarks/serve_load.py                     # 4 clients, 5 steps each
    python benchmarks/serve_load.py --clients 8 --hog_samples 1024 --out load.json

It starts ``rlscope serve`` (tiny Llama, byte-level tokenizer, CPU unless ``--device``) as a
child process, waits for its warm-up, then runs ``--clients`` threads at once. Each creates a
LoRA training client and runs ``--steps`` supervised steps, each: ``forward_backward``
(``--batch`` datums) + ``optim_step``, a sampler on the new weights
(``save_weights_for_sampler``), one ``sample`` of ``--num_samples`` × ``--max_tokens``; at the
end ``save_state``. Every call is timed from submission to its result. With ``--hog_samples N``
one more client sends a single sample request of N sequences meanwhile (a fairness check: the
fair queue splits it into chunks, so the others' p99 should stay close).

Output: per kind, ``n``, ``p50_s``, ``p99_s``, ``max_s``; ``wall_s``; the server's peak
resident memory (``VmHWM``) before the load (after warm-up) and after it, in MiB.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import tyro


@dataclass(frozen=True)
class LoadConfig:
    """Size of the load test."""

    clients: int = 4
    """Concurrent SDK clients (threads, each with its own ServiceClient)."""
    steps: int = 5
    """Supervised steps per client."""
    batch: int = 8
    """Datums per forward_backward."""
    seq_len: int = 64
    """Tokens per datum."""
    num_samples: int = 4
    """Sequences per sample request."""
    max_tokens: int = 16
    """Tokens sampled per sequence."""
    hog_samples: int = 0
    """If > 0, one extra client sends one sample request of this many sequences."""
    hog_max_tokens: int = 128
    """Tokens per sequence of the hog's request."""
    device: str = "cpu"
    """Server device."""
    threads: int = 1
    """OMP_NUM_THREADS of the server process."""
    out: str = ""
    """Also write the JSON here."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _client(base_url: str, tok: str, cfg: LoadConfig, seed: int,
            times: dict[str, list[float]], lock: threading.Lock, errors: list[str]) -> None:
    import tinker
    from tinker import types

    def timed(kind: str, fn):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = fn()
        with lock:
            times.setdefault(kind, []).append(time.perf_counter() - t0)
        return out

    try:
        rng = np.random.default_rng(seed)
        service = tinker.ServiceClient(base_url=base_url, api_key="tml-local")
        tc = timed("create_model", lambda: service.create_lora_training_client(
            base_model=tok, rank=8).result())
        prompt = types.ModelInput.from_ints(list(b"User: What is 3 + 4?\n\nAssistant:"))
        params = types.SamplingParams(max_tokens=cfg.max_tokens, stop=[])
        for _ in range(cfg.steps):
            tokens = rng.integers(0, 256, size=(cfg.batch, cfg.seq_len + 1))
            data = [types.Datum(model_input=types.ModelInput.from_ints(row[:-1].tolist()),
                                loss_fn_inputs={"target_tokens": row[1:].astype(np.int64),
                                                "weights": np.ones(cfg.seq_len, np.float32)})
                    for row in tokens]
            timed("forward_backward",
                  lambda d=data: tc.forward_backward(d, "cross_entropy").result())
            timed("optim_step",
                  lambda: tc.optim_step(types.AdamParams(learning_rate=1e-3)).result())
            sampler = timed("save_weights_for_sampler",
                            lambda: tc.save_weights_and_get_sampling_client().result())
            timed("sample", lambda s=sampler: s.sample(
                prompt, num_samples=cfg.num_samples, sampling_params=params).result())
        timed("save_state", lambda: tc.save_state("load").result())
    except Exception as e:  # reported in the JSON, the other clients go on
        errors.append(f"client {seed}: {type(e).__name__}: {e}")


def _hog(base_url: str, tok: str, cfg: LoadConfig, times: dict[str, list[float]],
         lock: threading.Lock, errors: list[str]) -> None:
    import tinker
    from tinker import types

    try:
        service = tinker.ServiceClient(base_url=base_url, api_key="tml-local")
        sampler = service.create_sampling_client(base_model=tok).result()
        t0 = time.perf_counter()
        sampler.sample(types.ModelInput.from_ints(list(b"Hi")), num_samples=cfg.hog_samples,
                       sampling_params=types.SamplingParams(max_tokens=cfg.hog_max_tokens,
                                                            stop=[])).result()
        with lock:
            times.setdefault("hog_sample", []).append(time.perf_counter() - t0)
    except Exception as e:
        errors.append(f"hog: {type(e).__name__}: {e}")


def main(cfg: LoadConfig) -> int:
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    import httpx

    tmp = Path(tempfile.mkdtemp(prefix="serve_load_"))
    tok = tmp / "models" / "tiny-tok"
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(cfg.threads)}
    cmd = [sys.executable, "-c", "import sys; from rlscope.cli import main; "
           "sys.exit(main(sys.argv[1:]))", "serve", "--port", str(port), "--root",
           str(tmp / "runs"), "--write_tokenizer", str(tok), "--device", cfg.device,
           "--log_level", "warning"]
    if cfg.hog_samples > 1024:  # the server's default cap
        cmd += ["--max_num_samples", str(cfg.hog_samples)]
    with (tmp / "server.log").open("wb") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base_url}/api/v1/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start:\n"
                                 + (tmp / "server.log").read_text()[-2000:])
            time.sleep(0.2)
        # the server warms up on its worker; one throwaway client waits for it
        _client(base_url, str(tok), LoadConfig(steps=0), 10_000, {}, threading.Lock(), [])
        rss_idle = _peak_rss_mib(proc.pid)
        times: dict[str, list[float]] = {}
        lock = threading.Lock()
        errors: list[str] = []
        threads = [threading.Thread(target=_client, args=(base_url, str(tok), cfg, i, times,
                                                          lock, errors))
                   for i in range(cfg.clients)]
        if cfg.hog_samples:
            threads.append(threading.Thread(target=_hog, args=(base_url, str(tok), cfg, times,
                                                               lock, errors)))
        t0 = time.perf_counter()
        for th in reversed(threads):  # the hog (if any) first
            th.start()
            time.sleep(0.05)
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
        rss_peak = _peak_rss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    kinds = {kind: {"n": len(v), "p50_s": round(float(np.percentile(v, 50)), 4),
                    "p99_s": round(float(np.percentile(v, 99)), 4),
                    "max_s": round(max(v), 4)} for kind, v in sorted(times.items())}
    report = {"config": asdict(cfg), "wall_s": round(wall, 2), "latency": kinds,
              "server_peak_rss_mib_after_warmup": round(rss_idle, 1),
              "server_peak_rss_mib": round(rss_peak, 1), "errors": errors,
              "cpu_count": os.cpu_count()}
    text = json.dumps(report, indent=2)
    print(text)
    if cfg.out:
        Path(cfg.out).write_text(text + "\n")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main(tyro.cli(LoadConfig)))
