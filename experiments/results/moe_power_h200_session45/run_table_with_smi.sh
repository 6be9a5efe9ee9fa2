#!/bin/bash
# usage: runs/dev/table.sh SCALE_DTYPE TOKENS [IMPLS]
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 200 > $OUT/smi_$1.csv 2>&1 &
SMI=$!
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE > $OUT/smi_q_$1.txt 2>&1
python3 experiments/kernel_bench.py --op=moe --sweep=false --trace --impls=${3:-triton,pallas_triton} --tokens=$2 --scale_dtype=$1 --out_dir=$OUT/table_$1 > $OUT/table_$1.log 2>&1
rc=$?
kill $SMI
grep -v '^{' $OUT/table_$1.log | tail -25
python3 - $OUT/smi_$1.csv <<'PY'
import sys, csv
rows = list(csv.reader(open(sys.argv[1])))[1:]
def f(x):
    try: return float(x.split()[0])
    except Exception: return None
sm = [f(r[1]) for r in rows if len(r) > 4]; pw = [f(r[3]) for r in rows if len(r) > 4]
sm = [x for x in sm if x]; pw = [x for x in pw if x]
print("smi samples", len(rows), "sm MHz min/med/max", min(sm), sorted(sm)[len(sm)//2], max(sm), "power W max", max(pw))
print("throttle reasons seen", sorted({r[5].strip() for r in rows if len(r) > 5}))
PY
exit $rc
