"""pyproject.toml against what is installed: the versions satisfy the bounds of the dependencies
and of the extras `make test` installs, constraints/lower.txt pins exactly their lower bounds (what
`make test-lower` installs), the version and console scripts resolve, and every private jax._src
import in the code exists in the installed jax."""

import ast
import importlib
import importlib.util
import os
import tomllib
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import ddtree_jax
from tests import ROOT

with open(os.path.join(ROOT, "pyproject.toml"), "rb") as _f:
    PROJECT = tomllib.load(_f)["project"]
MAKE_TEST_EXTRAS = ("test", "plots")      # the Makefile installs '.[test,plots]'
MAKE_TEST_REQS = PROJECT["dependencies"] + [r for e in MAKE_TEST_EXTRAS for r in PROJECT["optional-dependencies"][e]]
LOWER_CONSTRAINTS = os.path.join(ROOT, "constraints", "lower.txt")


@pytest.mark.parametrize("req", MAKE_TEST_REQS)
def test_installed_version_satisfies_the_bound(req):
    r = Requirement(req)
    assert r.specifier.contains(metadata.version(r.name), True), \
        f"{r.name} {metadata.version(r.name)} is installed; pyproject.toml asks for {r.specifier}"


def _lower_bounds(reqs) -> dict:
    """{name: version} of each requirement's one `>=` bound (AssertionError naming one without)."""
    out = {}
    for req in map(Requirement, reqs):
        lows = [s.version for s in req.specifier if s.operator == ">="]
        assert len(lows) == 1, f"{req}: pyproject.toml needs one lower bound (>=) for make test-lower"
        out[canonicalize_name(req.name)] = Version(lows[0])
    return out


def _pins(path) -> dict:
    """{name: version} of a constraints file's `name==version` lines (comments and blanks skipped)."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                (spec,) = Requirement(line).specifier
                assert spec.operator == "==", f"{path}: {line} is not a pin (name==version)"
                out[canonicalize_name(Requirement(line).name)] = Version(spec.version)
    return out


def test_lower_constraints_pin_the_lower_bounds():
    assert _pins(LOWER_CONSTRAINTS) == _lower_bounds(MAKE_TEST_REQS)


def test_version_is_the_package_metadata():
    assert ddtree_jax.__version__ == PROJECT["version"] == metadata.version("ddtree-jax")


@pytest.mark.parametrize("name", sorted(PROJECT["scripts"]))
def test_console_script_names_a_function(name):
    module, func = PROJECT["scripts"][name].split(":")
    assert callable(getattr(importlib.import_module(module), func))


def _private_jax_imports():
    """(file, module, names) of every `from jax._src... import ...` in the packages."""
    out = []
    for package in ("ddtree_jax", "pallas_kernels"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, package)):
            for f in sorted(n for n in files if n.endswith(".py")):
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8") as src:
                    tree = ast.parse(src.read())
                out += [(os.path.relpath(path, ROOT), node.module, [a.name for a in node.names])
                        for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                        and (node.module or "").startswith("jax._src")]
    return out


def test_private_jax_imports_exist():
    found = _private_jax_imports()
    assert found, "the code imports jax._src modules; none were found"
    for path, module, names in found:
        mod = importlib.import_module(module)
        for name in names:
            assert hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}"), \
                f"{path}: from {module} import {name} fails under jax {metadata.version('jax')}"
