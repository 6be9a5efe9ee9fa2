python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
python3 -c "import jax, jaxlib, triton; print(jax.__version__, jaxlib.__version__, triton.__version__)"
date -u; SECONDS=0
timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/test_mla_attention.py -k "gpu_mosaic_decode_form or case37 or (does_not_spill and 8200) or (gpu_mosaic_k2_shapes and case32)" > $OUT/gpu_tests_mla.log 2>&1; echo tests rc=$? t=$SECONDS
grep -E "passed|failed|Error|error" $OUT/gpu_tests_mla.log | tail -8 | cut -c1-300
timeout 330 python3 experiments/mla_bench.py --ctx=8192,32768 --q=1 --streams=16,8,1 --impls=mosaic_gpu,xla --mosaic_decode_words --trace --load_s=3 --budget_s=250 --out=$OUT/mla_decode.json > $OUT/log_mla_decode.txt 2>&1; echo bench rc=$? t=$SECONDS
grep -v -i warn $OUT/log_mla_decode.txt | grep -v '^ceilings' | grep -v '^ctx=' | cut -c1-250 | tail -30
date -u
