set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p $OUT/mla
timeout 330 python3 experiments/mla_bench.py --ctx=1024 --q=256 --streams=16,8,1 --impls=mosaic_gpu,xla --trace --load_s=3 --budget_s=260 --out=$OUT/mla/mla_1k_q256.json > $OUT/mla/log_q256.txt 2>&1; echo "mla rc=$?"
timeout 200 python3 experiments/mla_bench.py --ctx=1024 --q=64 --streams=1 --impls=mosaic_gpu,xla --trace --load_s=3 --out=$OUT/mla/mla_1k_q64s1.json > $OUT/mla/log_q64s1.txt 2>&1; echo "mla rc=$?"
tail -12 $OUT/mla/log_q256.txt; tail -6 $OUT/mla/log_q64s1.txt
