#!/bin/bash
# usage: runs/dev/table2.sh SCALE_DTYPE TOKENS [IMPLS] [extra flags]
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE,TEMPERATURE > $OUT/smi_q_$1.txt 2>&1
python3 experiments/kernel_bench.py --op=moe --sweep=false --trace --impls=${3:-triton,pallas_triton} --tokens=$2 --scale_dtype=$1 --out_dir=$OUT/t_$1 $4 > $OUT/table_$1.log 2>&1
rc=$?
grep -v '^{' $OUT/table_$1.log | grep -v "^I1\|^W1\|xla_bridge" | tail -14 | cut -d"|" -f2,3,6,8,11,13,14,15,18
exit $rc
