"""Session-13 probe, kept as run on the H200 (`PYTHONPATH=. python3 experiments/results/tree_accept_gpu_exact_h200_session13.py`
-> tree_accept_gpu_exact_h200_session13.log): the tree_accept kernel compiled on the GPU against the
numpy golden on the test cases, poisoned outputs, exact equality."""
import os, sys, traceback, re
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, ".")
from tests.test_tree_accept import _case, CASES
from pallas_kernels.tree_accept.pallas_triton import tree_accept_pallas
from pallas_kernels.tree_accept.reference import tree_accept_reference
for case in CASES:
    t, tokens, post, start, active, kv, taps = _case(sum(case[:4]), *case)
    args = (t, jnp.asarray(tokens), jnp.asarray(post), jnp.asarray(start), jnp.asarray(active),
            tuple(map(jnp.asarray, kv)), jnp.asarray(taps))
    try:
        got = jax.block_until_ready(tree_accept_pallas(*args, poison=True))
        want = tree_accept_reference(np.asarray(t.parents), tokens, post, start, active, kv, taps, t.max_depth)
        ok = all(np.array_equal(np.asarray(g), w) for g, w in zip(got[:4], want[:4])) and \
            all(np.array_equal(np.asarray(g), w) for g, w in zip(got[4], want[4])) and np.array_equal(np.asarray(got[5]), want[5])
        print(case, "exact" if ok else "MISMATCH", flush=True)
    except Exception as e:
        msg = str(e)
        msg = re.sub(r"(\\x[0-9a-f]{2}|\\[ntr])+", "", msg)
        print(case, "ERROR", type(e).__name__, msg[:1500], flush=True)
        print("".join(traceback.format_exception(e))[-1500:], flush=True)
        break
