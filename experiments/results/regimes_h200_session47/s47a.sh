python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
python3 -c "import jax, jaxlib, triton; print(jax.__version__, jaxlib.__version__, triton.__version__)"
date -u
timeout 200 python3 experiments/kernel_bench.py --op=moe --sweep=false --trace --load_s=3 --impls=triton,pallas_triton --tokens=16,64,256 --out_dir=$OUT/bf16 > $OUT/log_bf16.txt 2>&1; echo rc=$?
grep -v -i warn $OUT/log_bf16.txt | tail -40
timeout 170 python3 experiments/kernel_bench.py --op=moe --sweep=false --trace --load_s=3 --impls=triton,pallas_triton --tokens=16,64,256 --scale_dtype=float16 --out_dir=$OUT/f16 > $OUT/log_f16.txt 2>&1; echo rc=$?
grep -v -i warn $OUT/log_f16.txt | tail -25
timeout 170 python3 experiments/mla_bench.py --ctx=8192 --q=1,16,64,256 --streams=16,1 --impls=mosaic_gpu,xla --trace --load_s=3 --out=$OUT/mla8k.json > $OUT/log_mla.txt 2>&1; echo rc=$?
grep -v -i warn $OUT/log_mla.txt | tail -40
