python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
python3 -c "import jax, jaxlib, triton; print(jax.__version__, jaxlib.__version__, triton.__version__)"
date -u; SECONDS=0
timeout 420 python3 experiments/mla_bench.py --ctx=8192 --q=1,16,64 --streams=16,8,1 --impls=mosaic_gpu,xla --trace --load_s=3 --budget_s=370 --out=$OUT/mla_8k.json > $OUT/log_mla_8k.txt 2>&1; echo bench rc=$? t=$SECONDS
timeout $(( 575 - SECONDS )) python3 -m pytest -q -p no:cacheprovider -rs --durations=0 tests/test_mla_attention.py -k "gpu_mosaic_timeline or gpu_mosaic_k2_shapes" > $OUT/gpu_tests_k2_timeline.log 2>&1; echo tests rc=$? t=$SECONDS
grep -E "passed|failed|FAIL|s call" $OUT/gpu_tests_k2_timeline.log | cut -c1-200 | tail -14
grep -v -i warn $OUT/log_mla_8k.txt | grep -v '^ceilings' | grep -v '^ctx=' | cut -c1-250 | tail -24
date -u
