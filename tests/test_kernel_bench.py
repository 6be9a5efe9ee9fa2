"""experiments/kernel_bench.py's --variants parsing (the benchmark itself needs a GPU and torch).

Run in a subprocess: the module defines absl flags at import, which must not meet other modules'."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHECK = """
from experiments.kernel_bench import parse_variants, _variant_cfgs
from pallas_kernels.moe import tuning
sets = parse_variants('bn_down=256, down_warps=8 ; scale_weights=false;dequant=bits;')
assert sets == [dict(bn_down=256, down_warps=8), dict(scale_weights=False), dict(dequant='bits')], sets
cfgs = _variant_cfgs(64, sets)
base = tuning.config(64)
assert cfgs[0] == base._replace(bn_down=256, down_warps=8) and cfgs[0].bn_up == base.bn_up
assert cfgs[1].scale_weights is False and cfgs[2].dequant == 'bits'
assert len(_variant_cfgs(64)) == 5   # the built-in sets when none are given
for bad, word in (('bn_dwn=4', 'bn_dwn'), ('bn_down', 'bn_down'), ('bn_down=x', 'bn_down'),
                  ('swap_ab=maybe', 'swap_ab')):
    try:
        parse_variants(bad)
    except ValueError as e:
        assert word in str(e), (bad, e)
    else:
        raise AssertionError(bad)
print('ok')
"""


def test_parse_variants():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
