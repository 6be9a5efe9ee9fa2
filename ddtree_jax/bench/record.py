"""One benchmark run as one JSON file: what ran, where, with what, and every row it measured.

A record is a dict:
    benchmark  str   the maintained benchmark's name (a key of `ddtree_jax.bench.report.SECTIONS`)
    command    str   the command line, as run
    commit     str   the git commit of the code (``+dirty`` when the tree had changes)
    date       str   UTC, ISO 8601 to the second
    device     dict  name, count, driver (None off a GPU)
    versions   dict  python, jax, jaxlib, triton, jax_triton, torch (None where not installed)
    ceilings   dict  the hardware ceilings measured in the same run (copy_tbps, matmul_tflops_*)
    rows       list  one dict per measured point
plus any benchmark-specific fields. Files are named ``<benchmark>_<YYYY-MM-DD>_<gpu>.json``
(`result_name`) and written atomically (`write_result`).
"""

from __future__ import annotations

import datetime
import importlib
import json
import math
import os
import re
import shlex
import subprocess
import sys

import jax

from ddtree_jax.atomic_io import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
REQUIRED = ("benchmark", "command", "commit", "date", "device", "versions", "ceilings", "rows")
_VERSIONED = ("jax", "jaxlib", "triton", "jax_triton", "torch")


def git_commit(root: str | None = None) -> str:
    """HEAD's hash (+dirty when tracked files differ), or $DDTREE_COMMIT where git has no repository
    (a copied tree), or "unknown"."""
    root = root or ROOT
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("DDTREE_COMMIT", "unknown")


def _version(module: str) -> str | None:
    try:
        return getattr(importlib.import_module(module), "__version__", None)
    except ImportError:
        return None


def device_info() -> dict:
    """The default backend's devices: name (device kind), count, and the NVIDIA driver (None
    elsewhere)."""
    devices = jax.devices()
    driver = None
    if devices[0].platform == "gpu":
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, check=True, timeout=30
                                    ).stdout.split()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            driver = None
    return {"name": devices[0].device_kind, "count": len(devices), "driver": driver}


def run_info(benchmark: str, argv: list[str] | None = None) -> dict:
    """The record's header for a run of `benchmark` started by `argv` (default sys.argv)."""
    argv = list(sys.argv if argv is None else argv)
    if argv and os.path.isabs(argv[0]) and argv[0].startswith(ROOT + os.sep):
        argv[0] = os.path.relpath(argv[0], ROOT)
    return {"benchmark": benchmark,
            "command": shlex.join(["python3"] + argv),
            "commit": git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "device": device_info(),
            "versions": {"python": sys.version.split()[0],
                         **{m: _version(m) for m in _VERSIONED}}}


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100', 'cpu' -> 'cpu'."""
    match = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", name.upper())
    return match.group(1).lower() if match else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def result_name(record: dict) -> str:
    """``<benchmark>_<YYYY-MM-DD>_<gpu>.json`` for a record."""
    return f"{record['benchmark']}_{record['date'][:10]}_{gpu_slug(record['device']['name'])}.json"


def check_record(record: dict, where: str = "record") -> dict:
    """The record itself, or ValueError naming `where` and the first missing or ill-typed field."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a result must be a JSON object; got {type(record).__name__}")
    for field in REQUIRED:
        if field not in record:
            raise ValueError(f"{where}: missing field {field!r}")
    types = {"benchmark": str, "command": str, "commit": str, "date": str, "device": dict,
             "versions": dict, "ceilings": dict, "rows": list}
    for field, kind in types.items():
        if not isinstance(record[field], kind):
            raise ValueError(f"{where}: field {field!r} must be {kind.__name__}; "
                             f"got {type(record[field]).__name__}")
    if not all(isinstance(r, dict) for r in record["rows"]):
        raise ValueError(f"{where}: every entry of 'rows' must be an object")
    return record


def finite(x):
    """x with every non-finite float (NaN, inf: not measured) made None, through dicts and lists."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def write_result(out_dir: str, record: dict) -> str:
    """Write `record` (checked; non-finite floats as null) to out_dir/result_name(record)
    atomically; -> the path."""
    record = finite(check_record(record))
    path = os.path.join(out_dir, result_name(record))
    write_json(path, record, indent=1, sort_keys=False, allow_nan=False)
    return path


def load_result(path: str) -> dict:
    """A result file, checked; ValueError naming the file if it is not one."""
    try:
        with open(path) as f:
            record = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    return check_record(record, path)
