set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,serial,driver_version,power.limit --format=csv
mkdir -p $OUT/bf16 $OUT/xla
timeout 200 python3 experiments/kernel_bench.py --op=moe --sweep=false --trace --load_s=3 --impls=bf16_weights --tokens=1,4,16,64,256,1024,4096 --budget_s=150 --out_dir=$OUT/bf16 > $OUT/bf16/log.txt 2>&1; echo "bf16 rc=$?"
grep -E "^->|^   [a-z_]+ [0-9.]+ s" $OUT/bf16/log.txt | tr '\n' ' '; echo
timeout 240 python3 experiments/kernel_bench.py --op=moe --sweep=false --trace --impls=xla --tokens=1,4,16,64,256,1024,4096 --budget_s=180 --out_dir=$OUT/xla > $OUT/xla/log.txt 2>&1; echo "xla rc=$?"
grep -E "^->|^   [a-z_]+ [0-9.]+ s" $OUT/xla/log.txt | tr '\n' ' '; echo
grep -A12 "^| T | impl" $OUT/bf16/moe.md | cut -c1-300
grep -A9 "^| T | impl" $OUT/xla/moe.md | cut -c1-300
