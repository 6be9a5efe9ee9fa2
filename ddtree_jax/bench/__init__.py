"""Benchmark support: result records (`record`) and the BENCHMARKS.md generator (`report`)."""
