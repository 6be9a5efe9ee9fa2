python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
date -u; SECONDS=0
timeout 150 python3 experiments/mla_bench.py --ctx=8192 --q=256,1 --streams=1 --impls=mosaic_gpu,xla --trace --load_s=3 --budget_s=80 --out=$OUT/mla8k_s1.json > $OUT/log_mla8k_s1.txt 2>&1; echo rc=$? t=$SECONDS
grep -v -i warn $OUT/log_mla8k_s1.txt | grep -v '^ceilings' | grep -v '^ctx=' | cut -c1-250 | tail -14
