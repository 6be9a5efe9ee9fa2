python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
python3 -c "import jax, jaxlib, triton; print(jax.__version__, jaxlib.__version__, triton.__version__)"
date -u; SECONDS=0
timeout 200 python3 experiments/mla_bench.py --ctx=8192,32768 --q=1 --streams=16 --impls=mosaic_gpu,xla --trace --load_s=3 --budget_s=150 --out=$OUT/mla_decode_s16.json > $OUT/log_mla_decode_s16.txt 2>&1; echo rc=$? t=$SECONDS
grep -v -i warn $OUT/log_mla_decode_s16.txt | grep -v '^ceilings' | grep -v '^ctx=' | cut -c1-250 | tail -16
V='bn_up=128;bm=64,num_warps=8,bn_down=128;bn_up=128,num_stages=2'
timeout 330 python3 experiments/kernel_bench.py --op=moe --impls=triton,triton_variants --tokens=4096,2048 --sweep=false --trace --budget_s=270 --variants="$V" --out_dir=$OUT/raw_large_t > $OUT/log_raw_large_t.txt 2>&1; echo rc=$? t=$SECONDS
grep "^|" $OUT/log_raw_large_t.txt | tail -24
date -u
