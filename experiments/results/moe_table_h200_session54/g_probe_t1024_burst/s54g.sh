set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
timeout 150 python3 runs/dev/probe_t1024.py 2>&1 | grep -v "^I1\|^W1\|Unable to init" | tail -20
