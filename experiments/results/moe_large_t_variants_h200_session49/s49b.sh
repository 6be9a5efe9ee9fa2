python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
date -u; SECONDS=0
V='bm=64,num_warps=8,bn_down=128;bm=128,num_warps=8,num_stages=2;bm=64;bm=64,num_warps=8'
timeout 300 python3 experiments/kernel_bench.py --op=moe --impls=pallas_triton,variants --tokens=4096,2048 --sweep=false --trace --budget_s=230 --variants="$V" --out_dir=$OUT/pallas_large_t > $OUT/log_pallas_large_t.txt 2>&1; echo rc=$? t=$SECONDS
grep "^|" $OUT/log_pallas_large_t.txt | cut -c1-330 | tail -24
timeout 260 python3 experiments/kernel_bench.py --op=moe --impls=xla,bf16_weights --tokens=256,1024,4096 --sweep=false --trace --budget_s=190 --out_dir=$OUT/baselines > $OUT/log_baselines.txt 2>&1; echo rc=$? t=$SECONDS
grep "^|" $OUT/log_baselines.txt | cut -c1-330 | tail -12
date -u
