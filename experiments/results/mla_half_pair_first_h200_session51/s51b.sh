# As run in session 51. The probe then took the module before the change (25f0be8) as its argument and main
# held the change; since the change was rejected, probe.py takes the changed module instead (see its docstring).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
date -u; SECONDS=0
timeout 330 python3 -m pytest -q -p no:cacheprovider -rs -x "tests/test_mla_attention.py::test_gpu_mosaic_decode_form" "tests/test_mla_attention.py::test_gpu_mosaic_kernel_does_not_spill" "tests/test_mla_attention.py::test_gpu_mosaic_context_kernel[128-2-ctx0-70-1-tma-False]" "tests/test_mla_attention.py::test_gpu_mosaic_context_kernel[192-1-ctx1-1-1-tma-False]" "tests/test_mla_attention.py::test_gpu_mosaic_context_kernel[128-2-ctx4-70-3-tma-False]" "tests/test_mla_attention.py::test_gpu_mosaic_context_kernel[64-1-ctx5-1-5-tma-False]" "tests/test_mla_attention.py::test_gpu_mosaic_context_kernel[64-1-ctx6-1-8-tma-False]" "tests/test_mla_attention.py::test_gpu_mosaic_context_kernel[136-1-ctx10-17-3-tma-False]" "tests/test_mla_attention.py::test_gpu_mosaic_context_kernel[128-2-ctx12-70-1-tma-True]" "tests/test_mla_attention.py::test_gpu_mosaic_context_kernel[64-1-ctx17-1-8-tma-True]" "tests/test_mla_attention.py::test_gpu_mosaic_context_kernel[200-2-ctx22-25-1-tma-True]" "tests/test_mla_attention.py::test_gpu_mosaic_k2_shapes" > $OUT/gpu_tests.log 2>&1; echo tests rc=$? t=$SECONDS
grep -E "passed|failed|Error|error" $OUT/gpu_tests.log | tail -8 | cut -c1-300
timeout $(( 560 - SECONDS )) python3 experiments/results/mla_half_pair_first_h200_session51/probe.py runs/dev/mosaic_gpu_25f0be8.py 8192 > $OUT/probe8k.log 2>&1; echo probe rc=$? t=$SECONDS
grep -v -i warn $OUT/probe8k.log | grep -E "^\| [0-9]|^device|Error" | cut -c1-200 | tail -30
date -u
