"""rlscope doctor: findings over a metrics table, importers for foreign logs (METRICS.md)."""
