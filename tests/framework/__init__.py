"""Tests of the framework package, ddtree_jax."""
