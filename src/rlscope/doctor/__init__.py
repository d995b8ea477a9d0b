"""`rlscope doctor`: findings with evidence for rlscope runs and foreign training logs.

Importers (`importers`: the format registry and sniffing; `formats` and `verl`: the readers;
`naming`) read a file into `MetricTable`s with canonical names (`translate`); `rules` turn a
table into findings; `summary` adds trend, timing and validation tables; `render` prints them.
Nothing here imports torch.
"""
