set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,serial,driver_version,power.limit --format=csv
python3 -c "import jax, jaxlib, triton; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'triton', triton.__version__)"
mkdir -p $OUT/kernels
timeout 555 python3 experiments/kernel_bench.py --op=moe --sweep=false --trace --load_s=3 --impls=triton,pallas_triton --tokens=1,4,16,64,256,1024,4096 --budget_s=470 --out_dir=$OUT/kernels > $OUT/kernels/log.txt 2>&1; echo "kernels rc=$?"
ls $OUT/kernels
tail -45 $OUT/kernels/log.txt | cut -c1-400
