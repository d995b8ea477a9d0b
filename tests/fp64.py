"""Shared helpers of the hand-computed component tests: float64 tensors and tolerances."""

from __future__ import annotations

import torch

F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-12}


def t(rows: list[list[float]] | list[float]) -> torch.Tensor:
    """A float64 tensor from nested lists (the tests write their expected values this way)."""
    return torch.tensor(rows, dtype=F64)
