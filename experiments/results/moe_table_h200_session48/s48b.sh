python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
python3 -c "import jax, jaxlib, triton; print(jax.__version__, jaxlib.__version__, triton.__version__)"
date -u
timeout 330 python3 experiments/kernel_bench.py --op=moe --sweep=false --trace --out_dir=$OUT/full > $OUT/log_full.txt 2>&1; echo rc=$?
grep "^|" $OUT/log_full.txt | tail -40
date -u
timeout 170 python3 experiments/kernel_bench.py --op=moe --sweep=false --trace --load_s=3 --impls=triton --tokens=1,4,1024,4096 --out_dir=$OUT/regimes > $OUT/log_regimes.txt 2>&1; echo rc=$?
grep "^|" $OUT/log_regimes.txt | tail -20
date -u
