"""Runs per minute when several training runs share one machine, printed as JSON.

    python benchmarks/concurrent_runs.py --method grpo --num_steps 300 --concurrency 1 2 4

For each concurrency N it starts N `rlscope train` processes at once (seeds 0..N−1, the
default sandbox: batch 96, token_reversal) and times them to the last one; runs per minute =
N / wall minutes. The tiny sandbox model leaves a GPU mostly idle between kernel launches, so
running several processes on one device should multiply throughput until the GPU or the
CPU cores that feed it saturate; on a 2-core CPU, N = 2 is the useful maximum. Each process
gets ``--threads`` CPU threads (default: cores / N, at least 1).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def run_batch(n: int, args: argparse.Namespace, runs_dir: str) -> dict[str, float]:
    threads = args.threads or max(1, (os.cpu_count() or 1) // n)
    commands = [[sys.executable, "-m", "rlscope.cli", "train", "--method", args.method,
                 "--num_steps", str(args.num_steps), "--seed", str(seed), "--eval_every", "0",
                 "--no_progress", "--threads", str(threads), "--runs_dir", runs_dir,
                 "--name", f"c{n}_s{seed}", "--device", args.device, "--doctor_every", "0",
                 *args.extra] for seed in range(n)]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for c in commands]
    errors = [p.communicate()[1].decode()[-500:] for p in procs if p.wait() != 0]
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"{len(errors)} runs failed:\n" + "\n".join(errors))
    return {"concurrency": n, "threads_per_run": threads, "wall_s": wall,
            "runs_per_minute": n / wall * 60}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="grpo")
    parser.add_argument("--num_steps", type=int, default=300)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--threads", type=int, default=0, help="CPU threads per run (0: auto)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("extra", nargs="*", help="more rlscope train options, after --")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as runs_dir:
        results = [run_batch(n, args, runs_dir) for n in args.concurrency]
    base = results[0]["runs_per_minute"]
    for r in results:
        r["speedup_vs_first"] = r["runs_per_minute"] / base
    print(json.dumps({"method": args.method, "num_steps": args.num_steps,
                      "device": args.device, "results": results}, indent=2))


if __name__ == "__main__":
    main()
