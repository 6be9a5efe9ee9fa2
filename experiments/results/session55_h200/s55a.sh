set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,serial,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
date -u; SECONDS=0
mkdir -p $OUT/a_gpu_tests $OUT/b_moe $OUT/c_mla
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 250 python3 -m pytest -q -p no:cacheprovider -rs -m gpu -n 6 tests/ > $OUT/a_gpu_tests/log.txt 2>&1; echo "tests rc=$? t=$SECONDS"
tail -3 $OUT/a_gpu_tests/log.txt | cut -c1-200
timeout 130 python3 experiments/kernel_bench.py --op=moe --sweep=false --trace --load_s=3 --impls=triton --tokens=16,1024 --out_dir=$OUT/b_moe > $OUT/b_moe/log.txt 2>&1; echo "moe rc=$? t=$SECONDS"
grep -A4 "^| T | impl | active E | MB moved | floor" $OUT/b_moe/moe.md | cut -c1-300
timeout $(( 575 - SECONDS )) python3 experiments/mla_bench.py --ctx=32768 --q=16 --streams=16 --impls=mosaic_gpu,xla --trace --load_s=3 --out=$OUT/c_mla/mla_32k_q16_s16.json > $OUT/c_mla/log_32k.txt 2>&1; echo "mla32k rc=$? t=$SECONDS"
timeout $(( 585 - SECONDS )) python3 experiments/mla_bench.py --ctx=8192 --q=256 --streams=1 --impls=mosaic_gpu,xla --trace --load_s=3 --out=$OUT/c_mla/mla_8k_q256_s1.json > $OUT/c_mla/log_8k.txt 2>&1; echo "mla8k rc=$? t=$SECONDS"
for f in $OUT/c_mla/log_32k.txt $OUT/c_mla/log_8k.txt; do grep -v -i warn $f | grep -v '^ceilings' | grep -v '^ctx=' | cut -c1-250 | tail -8; done
date -u
