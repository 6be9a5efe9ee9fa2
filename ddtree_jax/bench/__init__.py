"""Benchmark support: timing and ceilings (`timing`), result records (`record`), the BENCHMARKS.md
generator (`report`), parity checks (`parity`), the roofline (`roofline`) and memory plan
(`memory_plan`), the sweep (`sweep`, `sweep_io`), and what each benchmark script in experiments/
runs: `mla`, `mla_kernel`, `moe`, `ptx` (with `ptx_worker`), `projection`, `k2_step`, `decode`."""
