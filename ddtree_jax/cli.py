"""Decode a text prompt on a target + drafter pair; print the text, tau and tokens/s.

    python -m ddtree_jax "def fib(n):" --method=ddtree --budget=32 --max_new_tokens=64
    ddtree-generate "import os" --pair_dir=/path/to/pair --dtype=float32 --temperature=0.7

The pair: --pair_dir (default: the shipped pair, ddtree_jax.pair.SHIPPED) as `load_pair` reads
it. The prompt ("-": standard input) is encoded without special tokens; decoding stops at the
target's eos_token_id (--no_stop: at --max_new_tokens only). The continuation goes to standard
output, one line of figures (tokens, steps, tau, tokens/s, time to first token) to standard
error, and with --metrics `GenerateResult.metrics()` as JSON to standard output after the text.
"""

from __future__ import annotations

import argparse
import json
import sys

import jax.numpy as jnp

from ddtree_jax.engine import METHODS, Decoding, generate
from ddtree_jax.pair import SHIPPED, load_pair

DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddtree-generate", description=__doc__.split("\n")[0])
    p.add_argument("prompt", help='the prompt text ("-": read it from standard input)')
    p.add_argument("--pair_dir", default=SHIPPED, help="target/, drafter/ and the tokenizer")
    p.add_argument("--method", choices=METHODS, default="ddtree")
    p.add_argument("--budget", type=int, default=64, help="tree nodes (ddtree)")
    p.add_argument("--max_new_tokens", type=int, default=64)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="weights and caches")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--seed", type=int, default=0, help="the draws at temperature > 0")
    p.add_argument("--impl", default="auto", help="kernel implementation of attention and MoE")
    p.add_argument("--no_stop", action="store_true", help="do not stop at the end-of-text token")
    p.add_argument("--metrics", action="store_true", help="print GenerateResult.metrics() as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    pair = load_pair(args.pair_dir, DTYPES[args.dtype])
    if pair.tokenizer is None:
        raise SystemExit(f"ddtree-generate: no tokenizer.json in {args.pair_dir} or its target/")
    eos = pair.target[0].eos_token_id
    stop = () if args.no_stop or eos is None else eos
    out = generate(pair.target, pair.drafter, [prompt], method=args.method, budget=args.budget,
                   max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                   stop_tokens=stop, attn_impl=args.impl, moe_impl=args.impl,
                   decoding=Decoding(stage_reps=0), tokenizer=pair.tokenizer)
    print(out.texts[0], flush=True)
    if args.metrics:
        print(json.dumps(out.metrics()), flush=True)
    what = f"{args.method}" + (f" budget {args.budget}" if args.method == "ddtree" else "")
    print(f"{what}: {len(out.tokens[0])} tokens in {out.steps} steps, tau {out.tau:.2f}, "
          f"{out.tokens_per_second:.1f} tokens/s, time to first token "
          f"{out.first_token_seconds[0] * 1e3:.1f} ms (compile {out.compile_seconds:.1f} s)",
          file=sys.stderr, flush=True)
    return 0
