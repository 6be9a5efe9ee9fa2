set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
git rev-parse --short HEAD 2>/dev/null
mkdir -p $OUT/moe $OUT/tests
timeout 170 python3 experiments/kernel_bench.py --op=moe --impls=triton,triton_variants --tokens=16,64,256 --sweep=false --trace --load_s=3 --variants='bn_up=128' --out_dir=$OUT/moe > $OUT/moe/log.txt 2>&1; echo "moe rc=$?"
tail -40 $OUT/moe/log.txt
timeout 400 python3 -m pytest -q -p no:cacheprovider -rs -v -m gpu -n 6 --durations=25 tests/ > $OUT/tests/log.txt 2>&1; echo "tests rc=$?"
grep -E "passed|failed|error" $OUT/tests/log.txt | tail -5
grep -E "FAILED|ERROR" $OUT/tests/log.txt | head -20
