set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p $OUT/moe_raw $OUT/moe_pallas $OUT/tests
git diff --stat | tail -1
timeout 200 python3 -m pytest -q -p no:cacheprovider -rs -m gpu -n 4 tests/test_moe_kernels.py > $OUT/tests/moe_gpu.txt 2>&1; echo "tests rc=$?"; tail -3 $OUT/tests/moe_gpu.txt
timeout 150 python3 experiments/kernel_bench.py --op=moe --impls=triton,triton_variants --tokens=4,520 --sweep=false --trace --load_s=3 --variants='bn_up=64' --out_dir=$OUT/moe_raw > $OUT/moe_raw/log.txt 2>&1; echo "raw rc=$?"
tail -6 $OUT/moe_raw/log.txt
timeout 200 python3 experiments/kernel_bench.py --op=moe --impls=pallas_triton,variants --tokens=16,64,256 --sweep=false --trace --load_s=3 --variants='bn_up=64' --out_dir=$OUT/moe_pallas > $OUT/moe_pallas/log.txt 2>&1; echo "pallas rc=$?"
tail -8 $OUT/moe_pallas/log.txt
