"""Tests of the kernel library, pallas_kernels: every implementation against its golden."""
