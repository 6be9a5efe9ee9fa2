python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
date -u; SECONDS=0
# Session 51's 14 GPU cases again, now on b41a778 (runs.load_schedule moved out of the kernel body).
for g in 0 1 2 3; do
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -m pytest -q -p no:cacheprovider -rs $(cat runs/dev/idc$g.txt) > $OUT/gpu_tests_c$g.log 2>&1 &
done
wait; echo tests t=$SECONDS
for g in 0 1 2 3; do grep -E "passed|failed|FAILED|Error" $OUT/gpu_tests_c$g.log | cut -c1-200 | tail -3; done
timeout 150 python3 experiments/mla_bench.py --ctx=8192 --q=64 --streams=8,1 --impls=mosaic_gpu,xla --trace --load_s=3 --out=$OUT/mla_8k_q64.json > $OUT/log_mla_8k_q64.txt 2>&1; echo bench rc=$? t=$SECONDS
grep -v -i warn $OUT/log_mla_8k_q64.txt | grep -v '^ceilings' | grep -v '^ctx=' | cut -c1-250 | tail -8
timeout $(( 440 - SECONDS )) python3 experiments/kernel_bench.py --op=moe --impls=triton,triton_variants --tokens=4096,2048 --sweep=false --trace --load_s=3 --budget_s=$(( 330 - SECONDS )) --variants='bn_up=128' --out_dir=$OUT/moe_bn_up > $OUT/log_moe_bn_up.txt 2>&1; echo moe rc=$? t=$SECONDS
grep -v -i warn $OUT/log_moe_bn_up.txt | grep -E "^\||skipped|Error" | cut -c1-250 | tail -16
date -u
