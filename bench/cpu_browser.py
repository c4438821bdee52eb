"""The CPU path inside browser workers: prefill and decode tokens/s of the numpy engine in
Pyodide, for the rows of the browser matrix.

    .venv/bin/python bench/cpu_browser.py [--rows chromium,firefox,webkit] [--tokens 32] [--query ?gpu=0]

--query ?gpu=0 opens the page without trying the GPU: the CPU path answers in every row,
and no software GPU (SwiftShader, lavapipe) works beside it.

The page loads the default model; the worker builds the CPU backend (weights dequantized
once; that first request is "cold") and answers a fixed greedy ChatML prompt; the second,
identical request is "warm". Timings are measured inside the worker (webslm.generate).
Compare with bench/cpu.py (CPython and llama.cpp on the same model).

Since the worker generates through webslm.Engine, a row whose GPU admits the model answers on
the GPU executor, not the CPU path; the rows' reply says which ("backends"). The figures in
docs/RESULTS.md's CPU section predate that change.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests_browser"), str(ROOT)]

import drivers  # noqa: E402
import serve  # noqa: E402
from app_session import BootedRow, serve_in_thread  # noqa: E402

PROMPT = "Write a short paragraph about the history of the printing press."


def measure(name: str, url: str, tokens: int, query: str = "") -> dict:
    row = drivers.launch(name)
    try:
        booted = BootedRow(row, url, query=query)
        booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
        request = {"messages": [{"role": "user", "content": PROMPT}], "settings": {"temperature": 0, "max_tokens": tokens}}
        runs = []
        for label in ("cold", "warm"):
            started = time.monotonic()
            answer = booted.request("generate", request, timeout_s=1800)
            t, usage = answer["timings"], answer["usage"]
            runs.append({"label": label, "wall_s": round(time.monotonic() - started, 2),
                         "prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
                         "prefill_tokens_per_s": round(usage["prompt_tokens"] / t["prefill_seconds"], 2),
                         "decode_tokens_per_s": t["decode_tokens_per_s"]})
        memory = booted.request("memory-status")
        return {"row": name, "browser": booted.status["user_agent"], "query": query,
                "wasm_heap_bytes": memory.get("wasm_heap_bytes"),
                "cpu_kernel": booted.status.get("cpu_kernel"), "runs": runs}
    finally:
        row.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="chromium")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--query", default="", help='added to the page URL, e.g. "?gpu=0"')
    args = ap.parse_args(argv)
    server, url = serve_in_thread(serve.url_map(ROOT))
    try:
        load = os.getloadavg()
        results = [measure(name, url, args.tokens, args.query) for name in args.rows.split(",")]
        for r in results:
            r["loadavg_before"], r["loadavg_after"] = load, os.getloadavg()
    finally:
        server.shutdown()
    out = ROOT / "bench/results/cpu_browser.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print("| row | run | prompt tokens | prefill tok/s | decode tok/s | wall (s) |\n|---|---|---:|---:|---:|---:|")
    for r in results:
        for run in r["runs"]:
            print(f"| {r['row']} | {run['label']} | {run['prompt_tokens']} | {run['prefill_tokens_per_s']} | "
                  f"{run['decode_tokens_per_s']} | {run['wall_s']} |")
        print(f"{r['row']}: CPU kernel {r['cpu_kernel']}; Wasm heap {r['wasm_heap_bytes'] / 2**20:.0f} MiB; load average {r['loadavg_before'][0]:.2f} -> "
              f"{r['loadavg_after'][0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
