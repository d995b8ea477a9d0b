"""Typed fields of JSON request bodies: every getter raises `UserError` naming the field
(the app answers 400), never a ``TypeError`` that would become a 500.

Integers must be JSON integers (``true`` is not 1), floats JSON numbers that are finite
(``NaN`` and ``Infinity``, which Python's JSON parser accepts, are refused), strings strings of
bounded length, objects objects.
"""

from __future__ import annotations

import math
from collections.abc import Callable
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


def _typed(body: dict[str, Any], name: str, default: Any, types: type | tuple[type, ...],
           what: str, check: Callable[[Any], Any] | None = None) -> Any:
    """``body[name]`` if it is an instance of ``types`` (a JSON ``true`` passes only where
    ``types`` is ``bool``), passed through ``check``; ``default`` or null as they are.
    Raises `UserError` "field ... must be {what}" otherwise."""
    value = _get(body, name, default)
    if value is None or value is default:
        return value
    if not isinstance(value, types) or (isinstance(value, bool) and types is not bool):
        raise UserError(f"field {name!r} must be {what}, got {_show(value)}")
    return value if check is None else check(value)


def _in_range(name: str, value: Any, lo: float | None, hi: float | None) -> Any:
    """``value`` after checking ``lo <= value <= hi`` (either bound optional)."""
    if lo is not None and value < lo:
        raise UserError(f"field {name!r} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise UserError(f"field {name!r} must be <= {hi}, got {value}")
    return value


def _finite(name: str, value: int | float) -> float:
    """``value`` as a finite float."""
    try:
        out = float(value)
    except OverflowError:
        raise UserError(f"field {name!r} must be finite, got an integer too large for a "
                        "float") from None
    if not math.isfinite(out):
        raise UserError(f"field {name!r} must be finite, got {out}")
    return out


def get_int(body: dict[str, Any], name: str, default: Any = _MISSING, *,
            lo: int | None = None, hi: int | None = None) -> Any:
    """``body[name]`` as an int in ``[lo, hi]`` (``default`` when absent or null)."""
    return _typed(body, name, default, int, "an integer",
                  lambda v: _in_range(name, v, lo, hi))


def get_float(body: dict[str, Any], name: str, default: Any = _MISSING, *,
              lo: float | None = None, hi: float | None = None) -> Any:
    """``body[name]`` as a finite float in ``[lo, hi]`` (``default`` when absent or null)."""
    return _typed(body, name, default, (int, float), "a number",
                  lambda v: _in_range(name, _finite(name, v), lo, hi))


def get_bool(body: dict[str, Any], name: str, default: Any = _MISSING) -> Any:
    return _typed(body, name, default, bool, "true or false")


def get_str(body: dict[str, Any], name: str, default: Any = _MISSING, *,
            max_chars: int = MAX_STR_CHARS) -> Any:
    def bounded(value: str) -> str:
        if len(value) > max_chars:
            raise UserError(f"field {name!r} is longer than {max_chars} characters")
        return value

    return _typed(body, name, default, str, "a string", bounded)


def get_dict(body: dict[str, Any], name: str, default: Any = _MISSING) -> Any:
    return _typed(body, name, default, dict, "an object")


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
