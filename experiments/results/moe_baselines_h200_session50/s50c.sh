python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
date -u; SECONDS=0
timeout 420 python3 experiments/kernel_bench.py --op=moe --impls=xla,bf16_weights --tokens=256,1024,4096 --sweep=false --trace --budget_s=280 --out_dir=$OUT/baselines > $OUT/log_baselines.txt 2>&1; echo rc=$? t=$SECONDS
grep -E "^->|^   " $OUT/log_baselines.txt | tail -40 | paste -sd' ' | cut -c1-1500
grep "^|" $OUT/log_baselines.txt | cut -c1-330 | tail -12
date -u
