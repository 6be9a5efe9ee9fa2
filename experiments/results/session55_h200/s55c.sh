set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,serial,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
date -u; SECONDS=0
mkdir -p $OUT/e_mla_thin_margins
B=python3; E=experiments/mla_bench.py; O=$OUT/e_mla_thin_margins
timeout 260 $B $E --ctx=8192 --q=16,64 --streams=16,8 --impls=mosaic_gpu,xla --trace --load_s=3 --budget_s=200 --out=$O/mla_8k.json > $O/log_8k.txt 2>&1; echo "8k rc=$? t=$SECONDS"
timeout $(( 575 - SECONDS )) $B $E --ctx=32768 --q=64,16 --streams=8,16 --impls=mosaic_gpu,xla --trace --load_s=3 --budget_s=$(( 480 - SECONDS )) --out=$O/mla_32k.json > $O/log_32k.txt 2>&1; echo "32k rc=$? t=$SECONDS"
for f in $O/log_8k.txt $O/log_32k.txt; do grep -A12 "first 25 ms ms" $f | grep "^|" | cut -c1-250; grep -i skipped $f | head -3; done
date -u
