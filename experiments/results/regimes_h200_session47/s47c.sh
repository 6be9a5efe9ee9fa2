python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
date -u; SECONDS=0
timeout 420 python3 experiments/mla_bench.py --ctx=32768 --q=256,64,16,1 --streams=1,16 --impls=mosaic_gpu,xla --trace --load_s=3 --budget_s=300 --out=$OUT/mla32k.json > $OUT/log_mla32k.txt 2>&1; echo rc=$? t=$SECONDS
grep -v -i warn $OUT/log_mla32k.txt | grep -v '^ceilings' | grep -v '^ctx=' | cut -c1-250 | tail -30
