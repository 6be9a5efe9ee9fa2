"""The shipped DFlash drafter for the shipped target (block 16, target frozen).

Run (from the repository root, after train_target.py has exported the target and
distill_data.py has written the target's greedy continuations):
  python experiments/distill_data.py --target=assets/pair/target --out=runs/distill/greedy.npz \
      --num_sequences=65536
  python experiments/train_drafter.py --config=configs/train_drafter_small.py \
      --workdir=runs/drafter --export_dir=assets/pair/drafter
Overrides: --config.key=value (e.g. --config.target=path/to/hf_target --config.steps=200).
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    c = ConfigDict()
    c.target = "assets/pair/target"   # any target of the framework, HF layout
    c.tokenizer = "assets/pair/tokenizer.json"
    c.corpus_cache = "runs/data/corpus.npz"
    c.corpus_max_files = 0            # 0: every training file
    c.distill_data = "runs/distill/greedy.npz"  # "": train on corpus windows instead
    c.init_from = ""                  # an exported drafter to fine-tune ("": random weights)
    c.num_hidden_layers = 2
    c.target_layer_ids = (1, 3)       # () = the DFlash reference spacing
    c.block_size = 16
    c.gamma = 7.0                     # slot k weighted by exp(-(k-1)/gamma)
    c.labels = "target"               # "data": true next tokens; "target": the target's greedy tokens
    c.anchors_per_seq = 32
    c.seq_len = 256
    c.batch_size = 128
    c.steps = 6000                    # the cosine schedule ends here: size it to the budget
    c.time_budget_s = 400.0           # holds the 6000 steps on an H200 (~390 s)
    c.lr = 2e-3
    c.warmup = 100
    c.b1, c.b2 = 0.9, 0.95
    c.weight_decay = 0.01
    c.clip = 1.0
    c.seed = 0
    c.log_every = 100
    c.ckpt_every = 1000
    c.export_dtype = "bfloat16"
    return c
