"""Tests of the experiment entry points and the benchmark scripts (CPU parts)."""
