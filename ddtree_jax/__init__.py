"""ddtree-jax: lossless DDTree speculative decoding of Kimi-K2-class MoE models in JAX/Pallas."""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("ddtree-jax")
except _metadata.PackageNotFoundError:       # imported from a source tree that is not installed
    __version__ = "0+unknown"

from ddtree_jax.checkpoint import load_target, restore_checkpoint, save_checkpoint, save_target_hf
from ddtree_jax.config import ConfigError, DrafterConfig, Kernels, ModelConfig, QuantConfig, RopeScaling
from ddtree_jax.drafter import (DrafterCache, append_context, draft_block, drafter_hidden,
                                init_drafter, init_drafter_cache)
from ddtree_jax.drafter_io import load_drafter, save_drafter
from ddtree_jax.engine import Decoding, GenerateResult, generate
from ddtree_jax.serving import serve
from ddtree_jax.model import (ForwardOut, LatentCache, forward, init_cache, init_target,
                              target_logits)
from ddtree_jax.pair import Pair, load_pair
from ddtree_jax.sampling import Sampling
from ddtree_jax.tokenizer import Tokenizer
from ddtree_jax.tree import Tree, build_shared_tree, build_tree, follow_tree

__all__ = [
    "ConfigError", "DrafterConfig", "ModelConfig", "QuantConfig", "RopeScaling", "Kernels",
    "Decoding", "Sampling",
    "ForwardOut", "LatentCache", "forward", "init_cache", "init_target", "target_logits",
    "load_target", "save_target_hf", "save_checkpoint", "restore_checkpoint",
    "DrafterCache", "init_drafter", "init_drafter_cache", "drafter_hidden", "append_context",
    "draft_block", "load_drafter", "save_drafter",
    "Tree", "build_tree", "build_shared_tree", "follow_tree", "GenerateResult", "generate", "serve",
    "Tokenizer", "Pair", "load_pair", "__version__",
]
