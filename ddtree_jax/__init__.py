"""ddtree-jax: lossless DDTree speculative decoding of Kimi-K2-class MoE models in JAX/Pallas."""

from ddtree_jax.config import ConfigError, DrafterConfig, ModelConfig, QuantConfig, RopeScaling
from ddtree_jax.model import (ForwardOut, LatentCache, forward, init_cache, init_target,
                              target_logits)

__all__ = [
    "ConfigError", "DrafterConfig", "ModelConfig", "QuantConfig", "RopeScaling",
    "ForwardOut", "LatentCache", "forward", "init_cache", "init_target", "target_logits",
]
