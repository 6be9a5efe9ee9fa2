python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
date -u; SECONDS=0
timeout 200 python3 experiments/mla_bench.py --ctx=8192 --q=1 --streams=16 --impls=mosaic_gpu,xla --trace --load_s=3 --out=$OUT/mla_decode8k_s16.json > $OUT/log_mla_decode8k_s16.txt 2>&1; echo bench1 rc=$? t=$SECONDS
timeout $(( 530 - SECONDS )) python3 experiments/mla_bench.py --ctx=8192 --q=16,256 --streams=1 --impls=mosaic_gpu,xla --trace --load_s=3 --out=$OUT/mla_8k_s1.json > $OUT/log_mla_8k_s1.txt 2>&1; echo bench2 rc=$? t=$SECONDS
for f in $OUT/log_mla_decode8k_s16.txt $OUT/log_mla_8k_s1.txt; do grep -v -i warn $f | grep -v '^ceilings' | grep -v '^ctx=' | cut -c1-250 | tail -12; done
date -u
