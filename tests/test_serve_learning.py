"""Slow learning check (docs/tinker.md): a tiny model warm-started through the tinker SDK gets
better at arithmetic under the unmodified cookbook math_rl recipe served by `rlscope serve`.
About 8 minutes on 2 CPU cores; run with ``python -m pytest -q -m slow
tests/test_serve_learning.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("tinker")
pytest.importorskip("fastapi")
pytest.importorskip("tinker_cookbook")
pytest.importorskip("math_verify")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.slow
def test_heldout_arithmetic_accuracy_rises_under_math_rl(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from serve_learning_check import CheckConfig, main
    finally:
        sys.path.remove(str(BENCHMARKS))
    assert main(CheckConfig(out=str(tmp_path))) == 0
