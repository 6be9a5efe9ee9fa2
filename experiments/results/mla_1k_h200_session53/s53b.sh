set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
mkdir -p $OUT/mla
timeout 540 python3 experiments/mla_bench.py --ctx=1024 --q=1,16,64,256 --streams=16,8,1 --impls=mosaic_gpu,xla --trace --load_s=3 --budget_s=440 --out=$OUT/mla/mla_1k.json > $OUT/mla/log.txt 2>&1; echo "mla rc=$?"
tail -45 $OUT/mla/log.txt
