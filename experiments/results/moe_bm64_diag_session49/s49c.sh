python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
date -u; SECONDS=0
timeout 250 python3 experiments/results/moe_bm64_diag_session49/diag.py 2048 190 > $OUT/diag.log 2>&1; echo rc=$? t=$SECONDS
grep -v -i warn $OUT/diag.log | cut -c1-600
