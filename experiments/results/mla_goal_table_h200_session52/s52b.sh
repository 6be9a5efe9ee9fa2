python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
date -u; SECONDS=0
# The GPU tests not yet run on session 51's half-pair-first order: 4 pytest processes side by side
# (compiles and numpy goldens are CPU-bound; the GPU work is small), no preallocation.
for g in 0 1 2 3; do
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 330 python3 -m pytest -q -p no:cacheprovider -rs --durations=0 $(cat runs/dev/ids$g.txt) > $OUT/gpu_tests_g$g.log 2>&1 &
done
wait; echo tests t=$SECONDS
for g in 0 1 2 3; do grep -E "passed|failed|FAILED|Error" $OUT/gpu_tests_g$g.log | cut -c1-200 | tail -4; done
timeout $(( 570 - SECONDS )) python3 experiments/mla_bench.py --ctx=32768 --q=1,16,64 --streams=16,8,1 --impls=mosaic_gpu,xla --trace --load_s=3 --budget_s=$(( 500 - SECONDS )) --out=$OUT/mla_32k.json > $OUT/log_mla_32k.txt 2>&1; echo bench rc=$? t=$SECONDS
grep -v -i warn $OUT/log_mla_32k.txt | grep -v '^ceilings' | grep -v '^ctx=' | cut -c1-250 | tail -24
grep skipped $OUT/log_mla_32k.txt
date -u
