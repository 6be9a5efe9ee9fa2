set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,serial,driver_version,power.limit --format=csv
mkdir -p $OUT/baselines
timeout 560 python3 experiments/kernel_bench.py --op=moe --sweep=false --trace --load_s=3 --impls=ragged_dot,xla,bf16_weights --tokens=1,4,16,64,256,1024,4096 --budget_s=430 --out_dir=$OUT/baselines > $OUT/baselines/log.txt 2>&1; echo "baselines rc=$?"
ls $OUT/baselines
tail -40 $OUT/baselines/log.txt | cut -c1-400
