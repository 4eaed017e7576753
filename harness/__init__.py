"""zt's Python benchmark harness: comparisons against peer libraries,
writing tables and raw numbers to results/."""
