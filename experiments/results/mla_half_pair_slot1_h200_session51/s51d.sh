# As run in session 51 (the probe then at runs/dev/probe_slot1.py, 25f0be8's module at runs/dev/mosaic_gpu_25f0be8.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
date -u; SECONDS=0
timeout 185 python3 experiments/results/mla_half_pair_slot1_h200_session51/probe.py /tmp/mosaic_gpu_25f0be8.py > $OUT/probe_slot1.log 2>&1; echo probe rc=$? t=$SECONDS
grep -v -i warn $OUT/probe_slot1.log | grep -E "^\| [0-9]|^device|Error" | grep -v "round\|{" | cut -c1-200 | tail -12
grep -E "^\{" $OUT/probe_slot1.log | cut -c1-230 | tail -40
timeout $(( 370 - SECONDS )) python3 -m pytest -q -p no:cacheprovider -rs "tests/test_mla_attention.py::test_gpu_mosaic_kernel_does_not_spill" "tests/test_mla_attention.py::test_gpu_mosaic_decode_form" "tests/test_mla_attention.py::test_gpu_mosaic_context_kernel[128-2-ctx0-70-1-tma-False]" "tests/test_mla_attention.py::test_gpu_mosaic_context_kernel[128-2-ctx4-70-3-tma-False]" "tests/test_mla_attention.py::test_gpu_mosaic_context_kernel[136-1-ctx10-17-3-tma-False]" "tests/test_mla_attention.py::test_gpu_mosaic_context_kernel[64-1-ctx6-1-8-tma-False]" "tests/test_mla_attention.py::test_gpu_mosaic_context_kernel[128-2-ctx12-70-1-tma-True]" > $OUT/gpu_tests.log 2>&1; echo tests rc=$? t=$SECONDS
grep -E "passed|failed|Error|error" $OUT/gpu_tests.log | tail -6 | cut -c1-300; head -c 300 $OUT/gpu_tests.log
