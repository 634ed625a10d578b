"""Measurement tools: load generators and side-by-side comparisons (results in docs/benchmarks.md)."""
