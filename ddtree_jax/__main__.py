"""`python -m ddtree_jax`: the text generation command line (ddtree_jax.cli)."""

from ddtree_jax.cli import main

raise SystemExit(main())
