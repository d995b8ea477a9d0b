"""Typed fields of JSON request bodies: every getter raises `UserError` naming the field
(the app answers 400), never a ``TypeError`` that would become a 500.

Integers must be JSON integers (``true`` is not 1), floats JSON numbers that are finite
(``NaN`` and ``Infinity``, which Python's JSON parser accepts, are refused), strings strings of
bounded length, objects objects.
"""

from __future__ import annotations

import math
from typing import Any

from rlscope.serve.state import UserError

_MISSING: Any = object()
MAX_STR_CHARS = 4096
"""Longest string field accepted (ids, names, paths)."""


def _get(body: dict[str, Any], name: str, default: Any) -> Any:
    value = body.get(name, default) if isinstance(body, dict) else default
    if value is _MISSING:
        raise UserError(f"field {name!r} is required")
    return value


def get_int(body: dict[str, Any], name: str, default: Any = _MISSING, *,
            lo: int | None = None, hi: int | None = None) -> Any:
    """``body[name]`` as an int in ``[lo, hi]`` (``default`` when absent or null)."""
    value = _get(body, name, default)
    if value is None or value is default:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"field {name!r} must be an integer, got {_show(value)}")
    if lo is not None and value < lo:
        raise UserError(f"field {name!r} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise UserError(f"field {name!r} must be <= {hi}, got {value}")
    return value


def get_float(body: dict[str, Any], name: str, default: Any = _MISSING, *,
              lo: float | None = None, hi: float | None = None) -> Any:
    """``body[name]`` as a finite float in ``[lo, hi]`` (``default`` when absent or null)."""
    value = _get(body, name, default)
    if value is None or value is default:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"field {name!r} must be a number, got {_show(value)}")
    try:
        value = float(value)
    except OverflowError:
        raise UserError(f"field {name!r} must be finite, got an integer too large for a "
                        "float") from None
    if not math.isfinite(value):
        raise UserError(f"field {name!r} must be finite, got {value}")
    if lo is not None and value < lo:
        raise UserError(f"field {name!r} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise UserError(f"field {name!r} must be <= {hi}, got {value}")
    return value


def get_bool(body: dict[str, Any], name: str, default: Any = _MISSING) -> Any:
    value = _get(body, name, default)
    if value is None or value is default:
        return value
    if not isinstance(value, bool):
        raise UserError(f"field {name!r} must be true or false, got {_show(value)}")
    return value


def get_str(body: dict[str, Any], name: str, default: Any = _MISSING, *,
            max_chars: int = MAX_STR_CHARS) -> Any:
    value = _get(body, name, default)
    if value is None or value is default:
        return value
    if not isinstance(value, str):
        raise UserError(f"field {name!r} must be a string, got {_show(value)}")
    if len(value) > max_chars:
        raise UserError(f"field {name!r} is longer than {max_chars} characters")
    return value


def get_dict(body: dict[str, Any], name: str, default: Any = _MISSING) -> Any:
    value = _get(body, name, default)
    if value is None or value is default:
        return value
    if not isinstance(value, dict):
        raise UserError(f"field {name!r} must be an object, got {_show(value)}")
    return value


def str_dict(value: Any, name: str) -> dict[str, str]:
    """A ``{str: str}`` object (e.g. ``user_metadata``), or {} for null."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise UserError(f"field {name!r} must be an object of strings")
    if sum(len(k) + len(v) for k, v in value.items()) > 64 * MAX_STR_CHARS:
        raise UserError(f"field {name!r} is too large")
    return dict(value)


def _show(value: Any) -> str:
    """A short description of a bad value (its type, and its text when short)."""
    text = repr(value)
    return f"{type(value).__name__} {text}" if len(text) <= 40 else type(value).__name__
