"""Small demo of the target model: init (or load), prefill, greedy decode, print tokens and timing.

    python experiments/demo.py --preset=tiny --new_tokens=16
    python experiments/demo.py --checkpoint=/path/to/hf_dir
"""

import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

import ddtree_jax as dj

_PRESET = flags.DEFINE_string("preset", "tiny", "ModelConfig preset (ignored with --checkpoint)")
_CKPT = flags.DEFINE_string("checkpoint", None, "HF checkpoint directory to load instead of random init")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 12, "random prompt length")
_NEW = flags.DEFINE_integer("new_tokens", 16, "tokens to decode greedily")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed")


def main(argv):
    del argv
    if _CKPT.value:
        cfg, params = dj.load_target(_CKPT.value)
    else:
        cfg = dj.ModelConfig.preset(_PRESET.value)
        params = dj.init_target(cfg, jax.random.key(_SEED.value))
    rng = np.random.default_rng(_SEED.value)
    prompt = rng.integers(0, cfg.vocab_size, size=(1, _PROMPT_LEN.value)).astype(np.int32)
    max_len = _PROMPT_LEN.value + _NEW.value
    dtype = jax.tree_util.tree_leaves(params)[0].dtype

    @jax.jit
    def step(params, tokens, positions, cache):
        out = dj.forward(params, cfg, tokens, positions, cache)
        return jnp.argmax(out.logits[:, -1], axis=-1).astype(jnp.int32), out.cache

    cache = dj.init_cache(cfg, 1, max_len, dtype)
    t0 = time.perf_counter()
    nxt, cache = step(params, prompt, jnp.arange(prompt.shape[1], dtype=jnp.int32)[None], cache)
    nxt.block_until_ready()
    t_prefill = time.perf_counter() - t0
    out = [int(nxt[0])]
    pos = lambda i: jnp.full((1, 1), prompt.shape[1] + i, jnp.int32)
    # warm-up: the decode step compiles and runs once here; `step` returns a new cache (nothing is
    # donated), so the one the timed loop starts from is untouched
    jax.block_until_ready(step(params, nxt[:, None], pos(0), cache))
    t0 = time.perf_counter()
    for i in range(_NEW.value - 1):
        nxt, cache = step(params, nxt[:, None], pos(i), cache)
        out.append(int(nxt[0]))
    jax.block_until_ready(cache)
    t_decode = time.perf_counter() - t0
    print(f"model: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
          f"{cfg.n_routed_experts} experts ({cfg.quant.format}), backend {jax.default_backend()}")
    print(f"prompt  ({prompt.shape[1]} tokens): {prompt[0].tolist()}")
    print(f"greedy  ({len(out)} tokens): {out}")
    print(f"prefill (incl. compile): {t_prefill * 1e3:.1f} ms; decode: "
          f"{t_decode / max(1, len(out) - 1) * 1e3:.2f} ms/token (after an untimed warm-up step)")


if __name__ == "__main__":
    app.run(main)
