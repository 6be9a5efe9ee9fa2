python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date +%s > /tmp/t0
rm -rf /tmp/old && mkdir /tmp/old && cp -r pallas_kernels ddtree_jax experiments /tmp/old/ && cp runs/dev/moe_pt_old.py /tmp/old/pallas_kernels/moe/pallas_triton.py
for sd in float16 bfloat16; do
for tree in new old; do
  if [ $tree = new ]; then P=$PWD; else P=/tmp/old; fi
  PYTHONPATH=$P:/tmp/site timeout 100 python3 $P/experiments/kernel_bench.py --op=moe --impls=pallas_triton --sweep=false --trace --tokens=1,4,16,64,256 --scale_dtype=$sd --out_dir=$OUT/${sd}_$tree > $OUT/${sd}_$tree.log 2>&1; echo $sd $tree rc=$? t=$(( $(date +%s) - $(cat /tmp/t0) ))
done; done
PYTHONPATH=$PWD:/tmp/site timeout 170 python3 -m pytest -q -p no:cacheprovider -rs tests/test_moe_kernels.py > $OUT/gpu_tests.log 2>&1; echo tests rc=$? t=$(( $(date +%s) - $(cat /tmp/t0) )); tail -3 $OUT/gpu_tests.log | cut -c1-300
grep -E "FAILED|Error" $OUT/gpu_tests.log | head -6 | cut -c1-300
for sd in float16 bfloat16; do for tree in new old; do grep '^{"impl"' $OUT/${sd}_$tree.log | python3 runs/dev/summ.py ${sd}_$tree; done; done
