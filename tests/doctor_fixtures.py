"""The doctor's fixture generators (tests/fixtures/doctor/make_*.py) as modules, loaded once
so that every test module shares the same module object."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

FIXTURES = Path(__file__).parent / "fixtures" / "doctor"


def generator(name: str) -> ModuleType:
    """The module of ``FIXTURES/<name>.py`` (``make_log_fixtures``, ``make_name_fixtures``)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, FIXTURES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
