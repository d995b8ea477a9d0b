"""The doctor on a large verl console log: time and peak memory, printed as JSON.

    python benchmarks/doctor_large_log.py [--mb 100]

Builds a verl-format log of about ``--mb`` megabytes by repeating the metric lines of
tests/fixtures/doctor/verl_console.log with increasing step numbers (a long run of the same
shape: ~60 metrics per step, interleaved non-metric lines), then imports and diagnoses it in a
child process that reports its own peak resident memory. Also measures the fixture itself as
the baseline, in the same run.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "doctor" / "verl_console.log"
CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
from rlscope.doctor.diagnosis import run_doctor
(d,) = run_doctor(sys.argv[1])
wall = time.perf_counter() - t0
print(json.dumps({"seconds": wall, "peak_rss_mb": resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss / 1024, "steps": d.table.steps[1], "values": d.table.n_points,
    "metrics": len(d.table.names()), "findings": sorted(f.id for f in d.findings),
    "torch_imported": "torch" in sys.modules}))
"""


def build(target_mb: float, out: Path) -> int:
    lines = FIXTURE.read_text().splitlines()
    step_re = re.compile(r"step:(\d+) - ")
    body = [line for line in lines if step_re.search(line) or not line.startswith(" ")]
    written, offset = 0, 0
    with out.open("w") as f:
        while written < target_mb * 2**20:
            for line in body:
                text = step_re.sub(lambda m, o=offset: f"step:{int(m.group(1)) + o} - ",
                                   line) + "\n"
                f.write(text)
                written += len(text)
            offset += 46
    return written


def measure(path: Path) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="size of the generated log")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "large_verl.log"
        t0 = time.perf_counter()
        size = build(args.mb, path)
        build_s = time.perf_counter() - t0
        baseline = measure(FIXTURE)
        large = measure(path)
    print(json.dumps({"fixture": {"bytes": FIXTURE.stat().st_size, **baseline},
                      "large": {"bytes": size, "build_seconds": build_s, **large},
                      "mb_per_second": size / 2**20 / float(large["seconds"])}, indent=2))


if __name__ == "__main__":
    main()
