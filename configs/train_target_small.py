"""The shipped target: a small Kimi-K2 architecture (MLA, noaux_tc MoE, shared expert) on stdlib code.

Run (from the repository root):
  python experiments/train_target.py --config=configs/train_target_small.py \
      --workdir=runs/target --export_dir=assets/pair/target
Overrides: --config.key=value (e.g. --config.steps=200 --config.time_budget_s=0).
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    c = ConfigDict()
    c.tokenizer = "assets/pair/tokenizer.json"
    c.corpus_cache = "runs/data/corpus.npz"
    c.corpus_max_files = 0            # 0: every training file
    c.preset = ""                     # a ModelConfig preset name instead of `model` (e.g. "tiny")
    c.model = ConfigDict(dict(
        hidden_size=256, intermediate_size=768, moe_intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32,
        qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=1.0,
        max_position_embeddings=2048, rope_theta=10000.0))
    c.seq_len = 256
    c.batch_size = 32
    c.steps = 20000                   # upper bound; time_budget_s usually decides
    c.time_budget_s = 90.0            # wall-clock budget of the loop, compile included (0: none)
    c.lr = 3e-3
    c.warmup = 100
    c.b1, c.b2 = 0.9, 0.95
    c.weight_decay = 0.1
    c.clip = 1.0
    c.seed = 0
    c.log_every = 100
    c.ckpt_every = 1000
    c.export_dtype = "bfloat16"
    return c
