set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,serial,pci.bus_id,power.limit --format=csv
git log -1 --format=%h
mkdir -p $OUT/moe
timeout 250 python3 experiments/kernel_bench.py --op=moe --impls=triton,pallas_triton --tokens=16,64,256 --sweep=false --trace --load_s=3 --out_dir=$OUT/moe > $OUT/moe/log.txt 2>&1; echo "moe rc=$?"
tail -9 $OUT/moe/log.txt
