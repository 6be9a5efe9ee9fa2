"""Measure the exported pair on the held-out prompts and write its MANIFEST.json.

  python experiments/ship_pair.py --pair_dir=assets/pair --target_workdir=runs/target \
      --drafter_workdir=runs/drafter

Greedy (temperature 0) generation with methods ar, dflash (block = the drafter's) and ddtree
(--budget); records each tau and tokens/s, whether the speculative outputs equal ar's, copies
the loss curves next to the pair and writes MANIFEST.json: sha256 of every file, the training
commands and summaries, the data description and the measurements with date and device.
With --target_workdir= (or --drafter_workdir=) empty, that model is the one the existing
MANIFEST.json describes (its files' sha256 must match): its data, command and training record are
carried over. --retap_workdir names retap_drafter.py's work dir when the drafter was re-tapped
(experiments/retap_drafter.py) from the one the manifest lists: its command and statistics join
the manifest.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil

import jax
import jax.numpy as jnp
from absl import app, flags

from ddtree_jax import engine
from ddtree_jax.atomic_io import write_json
from ddtree_jax.training import data
from ddtree_jax.checkpoint import load_target
from ddtree_jax.drafter_io import load_drafter
from ddtree_jax.pair import manifest_record

_PAIR = flags.DEFINE_string("pair_dir", "assets/pair", "holds target/, drafter/, heldout_prompts.json")
_TWORK = flags.DEFINE_string("target_workdir", "runs/target",
                              "train_target.py's work dir ('': keep the manifest's target record)")
_DWORK = flags.DEFINE_string("drafter_workdir", "runs/drafter",
                              "train_drafter.py's work dir ('': keep the manifest's drafter record)")
_RETAP = flags.DEFINE_string("retap_workdir", "", "retap_drafter.py's work dir, when the drafter was re-tapped")
_TOK = flags.DEFINE_string("tokenizer", "assets/pair/tokenizer.json", "the tokenizer the pair was trained with")
_BUDGET = flags.DEFINE_integer("budget", 64, "DDTree node budget")
_NEW = flags.DEFINE_integer("max_new_tokens", 128, "tokens generated per prompt")
_IMPL = flags.DEFINE_string("impl", "auto", "kernel implementation for attention and MoE")
_PREPARE = ("python experiments/prepare_data.py --tokenizer=assets/pair/tokenizer.json "
            "--prompts=assets/pair/heldout_prompts.json --corpus_cache=runs/data/corpus.npz")


def measure(target, drafter, prompts, budget: int, max_new: int, impl: str) -> dict:
    """tau, tokens/s and agreement with ar for each method, at temperature 0."""
    out, ref = {}, None
    for method in ("ar", "dflash", "ddtree"):
        r = engine.generate(target, drafter, prompts, method=method, budget=budget,
                            max_new_tokens=max_new, attn_impl=impl, moe_impl=impl, stage_reps=0)
        ref = r.tokens if ref is None else ref
        out[method] = {"tau": r.tau, "tokens_per_second": r.tokens_per_second, "steps": r.steps,
                       "streams_equal_to_ar": sum(a == b for a, b in zip(r.tokens, ref))}
        print(f"{method:7s} tau {r.tau:.3f}  {r.tokens_per_second:.1f} tok/s  steps {r.steps}  "
              f"equal to ar {out[method]['streams_equal_to_ar']}/{len(prompts)}", flush=True)
    out["ddtree_over_dflash_tau"] = out["ddtree"]["tau"] / out["dflash"]["tau"]
    return out


def main(argv):
    del argv
    pair = _PAIR.value
    retap = None
    if _RETAP.value:
        with open(os.path.join(_RETAP.value, "summary.json")) as f:
            retap = json.load(f)
    summaries = {}
    for name, work in (("target", _TWORK.value), ("drafter", _DWORK.value)):
        if not work:   # the manifest's record; a re-tapped drafter's weights are new
            unchecked = ("drafter/model.safetensors",) if name == "drafter" and retap else ()
            summaries[name] = manifest_record(pair, name, unchecked)
    if retap is not None and not _DWORK.value:
        with open(os.path.join(pair, "MANIFEST.json")) as f:
            listed = json.load(f)["files"]["drafter/model.safetensors"]["sha256"]
        if retap["source_drafter_sha256"] != listed:
            raise ValueError(f"{_RETAP.value}/summary.json re-tapped a drafter (sha256 "
                             f"{retap['source_drafter_sha256']}) other than the one the manifest lists")
    retap = retap or summaries.get("drafter", {}).get("retap")   # a kept drafter keeps its re-tap
    target = load_target(os.path.join(pair, "target"), dtype=jnp.bfloat16)
    drafter = load_drafter(os.path.join(pair, "drafter"), dtype=jnp.bfloat16)
    prompts = data.load_prompts(os.path.join(pair, "heldout_prompts.json"))
    results = measure(target, drafter, prompts, _BUDGET.value, _NEW.value, _IMPL.value)
    for name, work in (("target", _TWORK.value), ("drafter", _DWORK.value)):
        if work:
            with open(os.path.join(work, "summary.json")) as f:
                summaries[name] = json.load(f)
            shutil.copy(os.path.join(work, "loss.png"), os.path.join(pair, f"{name}_loss.png"))
    # A drafter trained on distill_data.py's continuations carries that file's metadata.
    distill = summaries["drafter"]["data"]
    distill = distill if distill and "target_sha256" in distill else None
    distill_cmd = [distill["command"]] if distill else []
    files = {}
    for root, _, names in os.walk(pair):
        for n in sorted(names):
            path = os.path.join(root, n)
            if os.path.relpath(path, pair) != "MANIFEST.json":
                files[os.path.relpath(path, pair)] = {"sha256": data.file_sha256(path),
                                                      "bytes": os.path.getsize(path)}
    manifest = {
        "description": "Small Kimi-K2-architecture target + DFlash drafter trained on Python stdlib code",
        "tokenizer": {"path": _TOK.value, "sha256": data.file_sha256(_TOK.value)},
        "files": dict(sorted(files.items())),
        "data": summaries["target"]["data"],
        "distill_data": {k: v for k, v in distill.items() if k != "corpus"} if distill else None,
        "commands": [_PREPARE, f"python {summaries['target']['command']}"] + distill_cmd
                    + [f"python {summaries['drafter']['command']}"]
                    + ([retap["command"]] if retap else [])
                    + ["python experiments/ship_pair.py " + " ".join(
                        f"--{k}={v}" for k, v in (("pair_dir", pair), ("target_workdir", _TWORK.value),
                                                  ("drafter_workdir", _DWORK.value),
                                                  ("retap_workdir", _RETAP.value),
                                                  ("budget", _BUDGET.value), ("max_new_tokens", _NEW.value),
                                                  ("impl", _IMPL.value)))],
        "training": {k: {f: s[f] for f in ("steps", "final_loss", "loop_seconds", "device", "config")
                         if f in s} | ({"slot_accuracy": s["slot_accuracy"], "tau_on_data": s["tau_on_data"]}
                                       if k == "drafter" else {})
                     for k, s in summaries.items()}
                    | ({"drafter_retap": {k: v for k, v in retap.items() if k != "command"}} if retap else {}),
        "evaluation": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "device": jax.devices()[0].device_kind, "jax": jax.__version__,
                       "temperature": 0.0, "prompts": len(prompts), "max_new_tokens": _NEW.value,
                       "block_size": drafter[0].block_size, "budget": _BUDGET.value, "impl": _IMPL.value,
                       "results": results},
    }
    write_json(os.path.join(pair, "MANIFEST.json"), manifest, indent=2)
    print(f"wrote {os.path.join(pair, 'MANIFEST.json')}", flush=True)


if __name__ == "__main__":
    app.run(main)
