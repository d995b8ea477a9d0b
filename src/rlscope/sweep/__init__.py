"""Sweeps: a TOML manifest of runs × grid points × seeds, executed in parallel worker
processes and aggregated into tidy results, a final table and curves.

- `manifest`: parse, check and expand a manifest into `RunSpec`s (imports torch through the
  config).
- `plan`: plan each run (run / skip / resume / restart / fail) from its directory, and verify
  finished runs.
- `processes`: the output folder's lock and the worker processes (which die with the sweep).
- `runner`: execute and record a sweep.
- `aggregate`: tidy rows and statistics across seeds (no torch; `rlscope report` reads it).
- `command`: `rlscope sweep`.
"""
