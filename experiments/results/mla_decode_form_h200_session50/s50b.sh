python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
date -u; SECONDS=0
timeout 180 python3 -m pytest -q -p no:cacheprovider -rs tests/test_moe_kernels.py -k "every_tuned_entry or asm or triton_kernels_write" > $OUT/gpu_tests_moe.log 2>&1; echo tests rc=$? t=$SECONDS
grep -E "passed|failed|Error|error" $OUT/gpu_tests_moe.log | tail -8 | cut -c1-300
timeout 240 python3 experiments/mla_bench.py --ctx=32768 --q=1 --streams=16,8,1 --impls=mosaic_gpu,xla --mosaic_decode_words --trace --budget_s=170 --out=$OUT/mla_decode32k.json > $OUT/log_mla_decode32k.txt 2>&1; echo bench rc=$? t=$SECONDS
grep "^ctx=" $OUT/log_mla_decode32k.txt | cut -c1-330
timeout $(( 520 - SECONDS )) python3 experiments/kernel_bench.py --op=moe --impls=xla --tokens=256 --sweep=false --trace --out_dir=$OUT/xla256 > $OUT/log_xla256.txt 2>&1; echo xla rc=$? t=$SECONDS
grep -E "^->|^   " $OUT/log_xla256.txt | tail -8
date -u
