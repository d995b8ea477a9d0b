"""The simulated doctor fixtures are exactly what their seeded generator writes, and small."""

from __future__ import annotations

import pytest
from doctor_fixtures import FIXTURES, generator

GEN = generator("make_log_fixtures")


@pytest.mark.parametrize("name", sorted(GEN.WRITERS))
def test_committed_fixture_matches_generator(name: str) -> None:
    data = GEN.WRITERS[name]()
    expected = data if isinstance(data, bytes) else data.encode("utf-8")
    committed = (FIXTURES / name).read_bytes()
    assert committed == expected, f"regenerate with python {FIXTURES / 'make_log_fixtures.py'}"
    assert len(committed) <= 200_000


def test_verl_log_has_the_real_value_forms() -> None:
    text = (FIXTURES / "verl_console.log").read_text(encoding="utf-8")
    assert "(TaskRunner pid=2841) step:1 - global_seqlen/min:" in text
    assert "actor/pg_loss:np.float64(" in text and "num_turns/min:np.int32(2)" in text
    assert "val-core/openai/gsm8k/acc/mean@8:np.float64(" in text
    assert "val-core/openai/gsm8k/acc/best@8/std:np.float64(" in text
    assert "val-aux/openai/gsm8k/acc/worst@8/mean:np.float64(" in text
    wrapped = [line for line in text.splitlines() if len(line) == GEN.WRAP_COLUMNS]
    assert len(wrapped) > 10


NAME_GEN = generator("make_name_fixtures")


@pytest.mark.parametrize("name", sorted(NAME_GEN.WRITERS))
def test_committed_name_fixture_matches_generator(name: str) -> None:
    """The name-coverage logs hold every name of the committed name lists: regenerate them
    when a list changes."""
    committed = (FIXTURES / name).read_text(encoding="utf-8")
    assert committed == NAME_GEN.WRITERS[name](), \
        f"regenerate with python {FIXTURES / 'make_name_fixtures.py'}"
    framework = NAME_GEN.FRAMEWORK[name]
    assert all(n in committed for n in NAME_GEN.names(framework))
    assert len(committed) <= 50_000
