"""`rlscope report`: a self-contained HTML page and static figures for a run or a sweep.

`load` reads a run directory or a sweep directory; `tidy` turns their rows into mean ± SEM
curves and final values; `figures` draws them (matplotlib, no pyplot); `html` renders the page
(curves, final table, crossings, the doctor's findings, sample rollouts, config and
environment); `build.build_report` ties them together and `command` is the CLI. Nothing here
imports torch.
"""
