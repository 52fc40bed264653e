"""A restore: plans, reads of each process's own regions, exchange, checks."""
