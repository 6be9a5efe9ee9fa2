python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
python3 -c "import jax, jaxlib, triton; print(jax.__version__, jaxlib.__version__, triton.__version__)"
date -u
V='swap_ab=true,bm=64,bn_down=64;swap_ab=true,bm=64,bn_down=128,min_bm=32;swap_ab=true,bm=128,num_stages=2,bn_down=64;swap_ab=true,bm=128,num_stages=2,bn_down=64,min_bm=32;swap_ab=true,bm=64,down_warps=8,bn_down=128'
timeout 280 python3 experiments/kernel_bench.py --op=moe --impls=pallas_triton,variants --sweep=false --trace --tokens=4096 --variants="$V" --out_dir=$OUT/t4096 > $OUT/log_t4096.txt 2>&1; echo rc=$?
grep -v -i warn $OUT/log_t4096.txt | tail -30
timeout 240 python3 experiments/kernel_bench.py --op=moe --impls=pallas_triton,variants --sweep=false --trace --tokens=2048 --variants="$V" --out_dir=$OUT/t2048 > $OUT/log_t2048.txt 2>&1; echo rc=$?
grep -v -i warn $OUT/log_t2048.txt | tail -30
