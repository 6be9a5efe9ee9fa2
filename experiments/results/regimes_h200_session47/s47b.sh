python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
date -u; SECONDS=0
timeout 200 python3 experiments/kernel_bench.py --op=moe --sweep=false --trace --load_s=3 --impls=triton,pallas_triton --tokens=16,64,256 --out_dir=$OUT/bf16b > $OUT/log_bf16b.txt 2>&1; echo rc=$? t=$SECONDS
grep -A10 'copy under the same load' $OUT/log_bf16b.txt | cut -c1-200
timeout 360 python3 experiments/mla_bench.py --ctx=8192 --q=16,64,256 --streams=16,1 --impls=mosaic_gpu,xla --trace --load_s=3 --budget_s=220 --out=$OUT/mla8k.json > $OUT/log_mla8k.txt 2>&1; echo rc=$? t=$SECONDS
grep -v -i warn $OUT/log_mla8k.txt | grep -v '^ceilings' | cut -c1-250 | tail -30
