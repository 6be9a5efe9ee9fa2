set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,serial,clocks.sm,power.draw --format=csv,noheader
date -u; SECONDS=0
mkdir -p $OUT/d_cluster4
timeout 400 python3 experiments/mla_mosaic_probe.py --shapes=32768:16:16,8192:16:16,8192:256:1,8192:64:16,32768:64:8,32768:256:1 --clusters=auto,4 --out=$OUT/d_cluster4/probe.json > $OUT/d_cluster4/log.txt 2>&1; echo "probe rc=$? t=$SECONDS"
grep -v -i warn $OUT/d_cluster4/log.txt | grep "^|" | cut -c1-250
grep -i error $OUT/d_cluster4/log.txt | cut -c1-300 | head -5
date -u
