"""A 300-step `dg` run on every sandbox task; prints the Markdown table of docs/tasks.md.

    python benchmarks/toy_tasks_dg.py > /tmp/table.md

Runs one after another (parallel runs on 2 cores oversubscribe the threads).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tempfile
import time

from rlscope.metrics.sinks import read_jsonl

RUNS = {
    "token_reversal": [],
    "masked_reversal": [],
    "chain_reversal": [],
    "chain_arithmetic": ["--vocab", "5", "--seq_len", "3"],
    "format_answer": ["--vocab", "5", "--seq_len", "4"],
    "digits_bandit": [],
    "lm_bandit": [],
}


def main() -> None:
    rows = ["| task | command | final test error | final entropy | wall time |",
            "| --- | --- | --- | --- | --- |"]
    with tempfile.TemporaryDirectory() as tmp:
        for task, extra in RUNS.items():
            args = ["rlscope", "train", "--task", task, "--method", "dg", "--num_steps", "300",
                    *extra]
            t0 = time.perf_counter()
            subprocess.run([*args, "--runs_dir", tmp, "--name", task, "--no_progress",
                            "--device", "cpu"], check=True, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - t0
            final = read_jsonl(__import__("pathlib").Path(tmp) / task / "eval.jsonl")[-1]
            rows.append(f"| `{task}` | `{shlex.join(args)}` | {final['eval/test_error']:.3f} | "
                        f"{final['eval/entropy']:.3f} | {wall:.0f} s |")
            sys.stderr.write(rows[-1] + "\n")
    sys.stdout.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
