"""`rlscope doctor`: findings with evidence for rlscope runs and foreign training logs.

Importers (`importers`, `verl`) read a file into `MetricTable`s with canonical names
(`translate`); `rules` turn a table into findings; `summary` adds trend, timing and
validation tables; `render` prints them. Nothing here imports torch.
"""
