# As run in session 51 (main's merge.py then held the one-pass variant that probe.py now carries).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
python3 -c "import jax, jaxlib, triton; print(jax.__version__, jaxlib.__version__, triton.__version__)"
date -u; SECONDS=0
timeout 200 python3 experiments/results/mla_merge_one_pass_h200_session51/probe.py > $OUT/merge_one_pass.log 2>&1; echo probe rc=$? t=$SECONDS
grep -v -i warn $OUT/merge_one_pass.log | grep -E "^\||^device|Error" | cut -c1-260
timeout 60 python3 -m pytest -q -p no:cacheprovider -rs tests/test_mla_merge.py > $OUT/gpu_tests_merge.log 2>&1; echo merge tests rc=$? t=$SECONDS
tail -3 $OUT/gpu_tests_merge.log | cut -c1-300
timeout 170 python3 experiments/mla_bench.py --ctx=8192 --q=1 --streams=16,8 --impls=mosaic_gpu,xla --trace --load_s=3 --budget_s=120 --out=$OUT/mla_decode8k.json > $OUT/log_mla_decode8k.txt 2>&1; echo bench rc=$? t=$SECONDS
grep -v -i warn $OUT/log_mla_decode8k.txt | grep -v '^ceilings' | grep -v '^ctx=' | cut -c1-250 | tail -12
timeout $(( 560 - SECONDS )) python3 -m pytest -q -p no:cacheprovider -rs tests/test_mla_attention.py -k "gpu_mosaic_context_kernel and (ctx14 or ctx15 or ctx16 or ctx17 or ctx18 or ctx19 or ctx20 or ctx21 or ctx22)" > $OUT/gpu_tests_context.log 2>&1; echo ctx tests rc=$? t=$SECONDS
tail -3 $OUT/gpu_tests_context.log | cut -c1-300
date -u
