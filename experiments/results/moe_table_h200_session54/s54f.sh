set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p $OUT/new
timeout 240 python3 experiments/kernel_bench.py --op=moe --sweep=false --trace --load_s=3 --impls=triton,pallas_triton --tokens=1024,2048,4096 --budget_s=170 --out_dir=$OUT/new > $OUT/new/log.txt 2>&1; echo "new rc=$?"
grep -A8 "^| T | impl | active E | MB moved | floor" $OUT/new/moe.md | cut -c1-260
