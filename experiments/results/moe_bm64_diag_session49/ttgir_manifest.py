import json, sys
sys.argv = ["x"]
from absl import flags
flags.FLAGS(["x"])
from unittest import mock
from pallas_kernels.moe import tuning, triton_impl
import experiments.ptx_stats as ps
# bypass the session-49 refusals to compile the refused form for inspection
with mock.patch.object(tuning.MoEConfig, "check", lambda self: self), \
     mock.patch.object(triton_impl, "_asm", lambda cfg, dtype: cfg.dequant == "asm"):
    m = ps.dump_moe_triton([2048], [dict(bm=64)])
json.dump([x for x in m if "gate_up" in x["key"]], open("/tmp/manifest.json", "w"))
print([x["key"] for x in m])
