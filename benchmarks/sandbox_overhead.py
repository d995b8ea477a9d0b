"""Milliseconds per sandboxed run, isolated (bubblewrap) vs weak (``--unsafe_sandbox``),
printed as JSON (docs/sandbox.md, "Cost").

    python benchmarks/sandbox_overhead.py --runs 40

Each run is one program (a correct ``add`` with 4 tests, or every shipped spec's reference
body with its tests) started, judged and torn down by `rlscope.sandbox.run_tests`, one at a
time; the modes alternate so that a change in machine load hits both alike. Also reports the
time of scoring all shipped references with 2 workers (`score_programs`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from rlscope.sandbox import TestCase, isolation_problem, run_tests
from rlscope.tasks.code import CodeConfig, load_specs, score_programs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="runs per mode (add program)")
    args = parser.parse_args()
    if problem := isolation_problem():
        raise SystemExit(f"isolated sandbox unavailable: {problem}")
    tests = [TestCase((1, 2), 3), TestCase((2, 2), 4), TestCase((-1, 1), 0), TestCase((5, 0), 5)]
    code = "def add(a, b):\n    return a + b\n"
    times: dict[str, list[float]] = {"isolated": [], "weak": []}
    for _ in range(args.runs):
        for mode in times:
            start = time.perf_counter()
            result = run_tests(code, "add", tests, unsafe=mode == "weak")
            times[mode].append(1000 * (time.perf_counter() - start))
            assert result.passed == 4, result
    specs = load_specs()
    batch: dict[str, float] = {}
    for mode in times:
        start = time.perf_counter()
        results = score_programs(specs, [s.reference for s in specs],
                                 CodeConfig(unsafe=mode == "weak"))
        batch[mode] = time.perf_counter() - start
        assert all(r.reward == 1.0 for r in results)
    print(json.dumps({
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                   f"load {os.getloadavg()[0]:.1f}, Python {platform.python_version()}",
        "runs": args.runs,
        "ms_per_run_median": {m: round(statistics.median(t), 1) for m, t in times.items()},
        "ms_per_run_p90": {m: round(sorted(t)[int(0.9 * len(t))], 1) for m, t in times.items()},
        f"seconds_{len(specs)}_references_2_workers": {m: round(s, 2) for m, s in batch.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
