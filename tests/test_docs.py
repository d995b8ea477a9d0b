"""Generated documentation stays in sync with the code that generates it."""

from pathlib import Path

from rlscope.methods import METHODS
from rlscope.methods.catalog import render_list
from rlscope.methods.catalog import render_markdown as render_methods
from rlscope.metrics.schema import render_markdown

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_metrics_doc_is_current() -> None:
    assert (DOCS / "metrics.md").read_text() == render_markdown(), (
        "docs/metrics.md is stale: python -m rlscope.metrics.schema > docs/metrics.md")


def test_methods_doc_is_current() -> None:
    assert (DOCS / "methods.md").read_text() == render_methods(), (
        "docs/methods.md is stale: python -m rlscope.methods.catalog > docs/methods.md")
    assert all(f"| `{name}` |" in render_methods() for name in METHODS)


def test_readme_shows_the_current_methods_listing() -> None:
    readme = (DOCS.parent / "README.md").read_text()
    assert f"```\n$ rlscope methods\n{render_list()}```" in readme, (
        "README.md's `rlscope methods` block is stale: paste the output of `rlscope methods`")
