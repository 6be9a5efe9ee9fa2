set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,serial --format=csv
grep -n "1 << 62" pallas_kernels/moe/tuning.py
mkdir -p $OUT/tests
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs -v -m gpu -n 6 tests/test_moe_kernels.py > $OUT/tests/log.txt 2>&1; echo "tests rc=$?"
grep -E "passed|failed|error" $OUT/tests/log.txt | tail -3
grep -E "FAILED|ERROR" $OUT/tests/log.txt | head -20
