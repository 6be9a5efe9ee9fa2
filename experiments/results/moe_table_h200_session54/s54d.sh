set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,serial,driver_version,power.limit --format=csv
mkdir -p $OUT/raw $OUT/pallas
timeout 260 python3 experiments/kernel_bench.py --op=moe --sweep=false --trace --load_s=3 --impls=triton,triton_variants,triton,triton_variants --variants='bn_up=128' --tokens=1024,4096 --budget_s=200 --out_dir=$OUT/raw > $OUT/raw/log.txt 2>&1; echo "raw rc=$?"
timeout 150 python3 experiments/kernel_bench.py --op=moe --sweep=false --trace --load_s=3 --impls=pallas_triton,variants --variants='bn_up=128' --tokens=1024,4096 --budget_s=90 --out_dir=$OUT/pallas > $OUT/pallas/log.txt 2>&1; echo "pallas rc=$?"
for d in raw pallas; do grep -A10 "^| T | impl | active E | MB moved | floor" $OUT/$d/moe.md | cut -c1-260; done
