"""The test suite: framework/ (ddtree_jax), kernels/ (pallas_kernels), experiments/ (the entry
points), notebooks; shared helpers beside this file."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
