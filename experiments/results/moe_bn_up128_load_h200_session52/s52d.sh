python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
date -u; SECONDS=0
# Second A/B of bn_up 128 on the T > 576 entry (raw kernels), with T = 1040 added; then Pallas at 2048.
timeout 150 python3 experiments/kernel_bench.py --op=moe --impls=triton,triton_variants --tokens=4096,2048,1040 --sweep=false --trace --load_s=3 --budget_s=110 --variants='bn_up=128' --out_dir=$OUT/moe_bn_up_raw > $OUT/log_moe_bn_up_raw.txt 2>&1; echo raw rc=$? t=$SECONDS
grep -v -i warn $OUT/log_moe_bn_up_raw.txt | grep -E "^\| [0-9]|skipped|Error" | cut -c1-250 | tail -14
timeout $(( 215 - SECONDS )) python3 experiments/kernel_bench.py --op=moe --impls=pallas_triton,variants --tokens=2048 --sweep=false --trace --load_s=3 --variants='bn_up=128' --out_dir=$OUT/moe_bn_up_pallas > $OUT/log_moe_bn_up_pallas.txt 2>&1; echo pallas rc=$? t=$SECONDS
grep -v -i warn $OUT/log_moe_bn_up_pallas.txt | grep -E "^\| [0-9]|skipped|Error" | cut -c1-250 | tail -8
date -u
