"""Where one CPython decode step of the CPU path goes: CPU time per operation, per token.

    PYTHONPATH=py .venv/bin/python bench/cpu_profile.py [--tokens 48] [--prompt 128]

The step is CpuBackend.forward_steps for one token (llama family: no gemma3 norms), written
out here with a thread-CPU-time mark after each operation (time.thread_time: the time this
thread ran, which a busy machine inflates less than wall time). Products split among threads
run partly on a helper, whose time this thread does not see, so set WEBSLM_CPU_THREADS=1 for
a whole picture. Every step's logits are checked against CpuBackend.decode_one on a second
backend, bit for bit, so this copy cannot drift from the real pass unnoticed.

Writes bench/results/cpu_profile.json (ms per token per operation, the load average).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"
RESULTS = ROOT / "bench/results/cpu_profile.json"


def profiled_step(b, token: int, spent: dict) -> np.ndarray:
    """One decode step of backend b (forward_steps' order), adding CPU seconds to spent."""
    from webslm.cpu.layers import apply_rope, attention, rms_norm, rope_tables
    a, clock = b.arch, time.thread_time
    last = clock()

    def mark(name: str) -> None:
        nonlocal last
        now = clock()
        spent[name] = spent.get(name, 0.0) + now - last
        last = now

    start = b.position
    b._reserve(start + 1)
    x = b.embedding.rows([token])
    cos, sin = rope_tables(np.arange(start, start + 1) + a.rope.position_offset, a.rope.rotary_dim, a.rope.base)
    mark("embedding, rope tables")
    for i, layer in enumerate(b.layers):
        h = rms_norm(x, layer.attn_norm, a.norm_eps)
        mark("rms_norm x2")
        q, k, v = layer.qkv(h)
        mark("q|k|v products")
        if layer.bq is not None:
            q, k, v = q + layer.bq, k + layer.bk, v + layer.bv
        q = apply_rope(q.reshape(1, a.n_heads, a.head_dim), cos, sin, a.rope.convention)
        k = apply_rope(k.reshape(1, a.n_kv_heads, a.head_dim), cos, sin, a.rope.convention)
        mark("rope (q, k)")
        b._k[i, start] = k[0]
        b._v[i, start] = v.reshape(a.n_kv_heads, a.head_dim)
        mark("KV cache write")
        o = attention(q, b._k[i, :start + 1], b._v[i, :start + 1], start, b.attention_scale, layer.window)
        mark("attention")
        x = x + layer.o_proj(o)[0]
        mark("o product, residual")
        h = rms_norm(x, layer.ffn_norm, a.norm_eps)
        mark("rms_norm x2")
        g, u = layer.gate_up(h)
        mark("gate|up products")
        s = (g / (np.float32(1) + np.exp(-g))) * u
        mark("silu * up")
        x = x + layer.down_proj(s)[0]
        mark("down product, residual")
    b.position = start + 1
    logits = b.logits(x)[0]
    mark("final norm, head (49k rows)")
    return logits


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--prompt", type=int, default=128, help="prompt ids before the profiled steps")
    ap.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = ap.parse_args(argv)
    import webslm
    from webslm.cpu import CpuBackend, kernels
    model = webslm.open_model(MODEL)
    if model.architecture.gemma3:
        print("the profiled step mirrors the llama family only", file=sys.stderr)
        return 2
    profiled, reference = CpuBackend(model), CpuBackend(model)
    prompt = list(range(100, 100 + args.prompt))
    profiled.prefill(prompt)
    reference.prefill(prompt)
    load_before, spent, token = os.getloadavg(), {}, 5
    for _ in range(args.tokens):
        got = profiled_step(profiled, token, spent)
        want = reference.decode_one(token)
        if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
            raise SystemExit("the profiled step differs from CpuBackend.decode_one: update bench/cpu_profile.py")
        token = int(np.argmax(got))
    per_token = {name: 1e3 * s / args.tokens for name, s in spent.items()}
    total = sum(per_token.values())
    print(f"{kernels.describe()}; {args.tokens} decode steps after {args.prompt} prompt ids")
    print("| operation | CPU ms per token | share |\n|---|---:|---:|")
    for name, ms in sorted(per_token.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {ms:.2f} | {100 * ms / total:.0f}% |")
    print(f"| total | {total:.2f} ({1e3 / total:.1f} tokens a CPU second) | |")
    print(f"load average before/after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"kernel": kernels.describe(), "tokens": args.tokens, "prompt": args.prompt,
                                    "ms_per_token": per_token, "loadavg_before": load_before,
                                    "loadavg_after": os.getloadavg()}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
