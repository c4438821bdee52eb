"""CPython decode of the CPU path with one thread and with products split between two, in one
process, alternating blocks of tokens, so that a shared machine's load falls on every
variant alike.

    PYTHONPATH=py .venv/bin/python bench/cpu_threads.py [--rounds 8] [--block 8]

Variants: 1 thread; 2 threads handing parts to a Python helper thread at its default threshold
(Kernels.THREAD_MIN_WEIGHTS: gate|up and the head); 2 threads on the native build's own pool
(qmatmul_pool.c) splitting products of 2^16+, 2^18+ (Kernels.SHARED_MIN_WEIGHTS: every layer
product of SmolLM2 in decode) and 2^20+ weights. Each has its own backend after the same 128-id prompt. Per block: wall and
process CPU seconds (all threads). Printed and written to bench/results/cpu_threads.json:
best and median tokens/s and tokens per CPU second, and whether all variants decoded the
same tokens (they must: the split does not change a bit).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"
RESULTS = ROOT / "bench/results/cpu_threads.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--block", type=int, default=8, help="tokens per variant per round")
    ap.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = ap.parse_args(argv)
    import webslm
    from webslm.cpu import CpuBackend, kernels
    built = kernels.kernels()
    if built is None:
        print("no native qmatmul build (tools/build_kernels.py)", file=sys.stderr)
        return 2
    model = webslm.open_model(MODEL)
    backends, tokens, blocks = {}, {}, {}
    pool = built._shared
    for name, threads, threshold, shared in (
            ("1 thread", 1, None, None),
            ("2 threads, Python helpers, split at 2^20", 2, None, None),
            ("2 threads, pool, split at 2^16", 2, 1 << 16, pool),
            ("2 threads, pool, split at 2^18 (default)", 2, None, pool),
            ("2 threads, pool, split at 2^20", 2, 1 << 20, pool)):
        if threads > 1 and shared is None and "pool" in name:
            continue                                  # a build without qmatmul_pool.c
        k = kernels.Kernels(built._q8, built._q4, built._prepare, name, threads=threads, shared=shared)
        if threshold is not None:
            k.THREAD_MIN_WEIGHTS = k.SHARED_MIN_WEIGHTS = threshold
        kernels._loaded[:] = [k]                      # the backend's matrices take this one
        backends[name] = CpuBackend(model)
        backends[name].prefill(list(range(100, 228)))
        tokens[name], blocks[name] = [5], []
    kernels._loaded[:] = [built]
    load_before = os.getloadavg()
    for _ in range(args.rounds):
        for name, b in backends.items():
            t, c = time.perf_counter(), time.process_time()
            for _ in range(args.block):
                tokens[name].append(int(np.argmax(b.decode_one(tokens[name][-1]))))
            blocks[name].append((time.perf_counter() - t, time.process_time() - c))
    summary = {}
    for name, rows in blocks.items():
        wall, cpu = [args.block / w for w, _ in rows], [args.block / c for _, c in rows]
        summary[name] = {"tok_s_best": max(wall), "tok_s_median": statistics.median(wall),
                         "tok_per_cpu_s_best": max(cpu), "tok_per_cpu_s_median": statistics.median(cpu)}
        s = summary[name]
        print(f"{name}: {s['tok_s_best']:.1f} tok/s best, {s['tok_s_median']:.1f} median; "
              f"{s['tok_per_cpu_s_best']:.1f} per CPU s best, {s['tok_per_cpu_s_median']:.1f} median")
    same = len({tuple(t) for t in tokens.values()}) == 1
    print(f"same tokens: {same}; load average {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "blocks": blocks, "same_tokens": same,
                                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()}, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
