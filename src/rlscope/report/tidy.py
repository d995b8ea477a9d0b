"""The report's view of results: tidy rows, mean ± SEM curves and final values per name.

Everything here is `rlscope.results` (numpy only), shared with ``rlscope sweep``'s tables so
that a run, a sweep and the report go through one code path; the conventions (non-finite
values kept, SEM with ddof = 1, a run's final value at its last logged step) are stated there.
`rows_from_run_dir` reads one run directory, `read_results_csv` a sweep's ``results.csv``.
"""

from __future__ import annotations

from rlscope.results import (
    RESULTS_COLUMNS,
    Curve,
    FinalValue,
    TidyRow,
    curves,
    final_values,
    finite,
    number,
    read_results_csv,
    sem,
)
from rlscope.results import ResultsError as ReportError
from rlscope.results import read_run_dir as rows_from_run_dir

__all__ = ["RESULTS_COLUMNS", "Curve", "FinalValue", "ReportError", "TidyRow", "curves",
           "final_values", "finite", "number", "read_results_csv", "rows_from_run_dir", "sem"]
