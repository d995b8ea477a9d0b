"""Sweeps: a TOML manifest of runs × grid points × seeds, executed in parallel worker
processes and aggregated into tidy results, a final table and curves.

- `manifest`: parse, check and expand a manifest into `RunSpec`s (imports torch through the
  config).
- `runner`: plan (run / skip / resume / restart), execute and record a sweep.
- `aggregate`: tidy rows and statistics across seeds (no torch; `rlscope report` reads it).
- `command`: `rlscope sweep`.
"""
