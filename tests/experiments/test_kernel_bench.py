"""experiments/kernel_bench.py and mla_bench.py from the command line: bad flags refused before any
device work (the benchmarks themselves need a GPU; their support is tested in
tests/framework/test_bench_moe.py and test_bench_mla.py)."""

import os

import pytest

from tests import ROOT, run_python


@pytest.mark.parametrize("argv, words", [
    (["--impls=triton,trition"], "--impls takes names from"),
    (["--impls=triton_variants", "--variants=swap_ab=true"], "the raw Triton kernels ignore swap_ab"),
    (["--impls=variants", "--variants=bn_up=128;bm=64"], "MoEConfig.dequant='asm' needs bm <= 32"),
])
def test_kernel_bench_refuses_bad_impls_before_device_work(argv, words, tmp_path):
    """An unknown implementation (never run as another path), raw-kernel variants that
    would time the tuned kernels under another name (a field those kernels ignore), or a set no kernel runs correctly (PTX
    dequantisation in 64-row blocks): refused by name, before any device work."""
    out = run_python([os.path.join(ROOT, "experiments", "kernel_bench.py"), f"--out_dir={tmp_path / 'kb'}", *argv])
    assert out.returncode != 0 and words in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "kb").exists()


@pytest.mark.parametrize("script", ["kernel_bench.py", "mla_bench.py"])
def test_load_s_below_the_sustained_window_is_refused(script):
    """--load_s of 1 s or less would leave the sustained window empty: refused at flag parsing,
    naming the flag, before any device work."""
    out = run_python([os.path.join(ROOT, "experiments", script), "--load_s=0.5"])
    assert out.returncode != 0 and "--load_s must be 0 (off) or more than 1" in out.stderr, out.stderr[-2000:]
