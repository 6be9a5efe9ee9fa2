"""The kernel library stands alone: every `pallas_kernels` module imports with `ddtree_jax` made
unimportable (no import circle between the two packages)."""

import os
import subprocess
import sys

from tests import ROOT


_SCRIPT = r"""
import importlib, importlib.abc, pkgutil, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "ddtree_jax" or name.startswith("ddtree_jax."):
            raise ImportError(f"{name} is blocked: pallas_kernels must not import it")
        return None

sys.meta_path.insert(0, Block())
import pallas_kernels
names = [m.name for m in pkgutil.walk_packages(pallas_kernels.__path__, "pallas_kernels.")]
optional = 0   # modules of raw Triton kernels, where the triton package is absent (CPU installs)
for name in names:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name not in ("triton", "jax_triton"):
            raise
        optional += 1
from pallas_kernels import registry
for op in ("moe_experts", "mla_attention", "drafter_attention", "drafter_qkv", "topk",
           "topk_logsumexp", "tree_search", "tree_accept"):
    registry.implementations(op)
assert not any(m == "ddtree_jax" or m.startswith("ddtree_jax.") for m in sys.modules)
print(len(names) - optional)
"""


def test_pallas_kernels_import_without_ddtree_jax():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) >= 30   # every kernel module was imported


def test_no_pallas_kernels_module_names_ddtree_jax_in_an_import():
    """Also imports inside functions, which the import above does not run."""
    import ast
    bad = []
    for folder, _, files in os.walk(os.path.join(ROOT, "pallas_kernels")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                for node in ast.walk(ast.parse(open(path).read(), path)):
                    names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                             [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                    bad += [f"{os.path.relpath(path, ROOT)}:{node.lineno}" for n in names
                            if n.split(".")[0] == "ddtree_jax"]
    assert not bad, bad
