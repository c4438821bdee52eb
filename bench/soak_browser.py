"""A long session in one page: many answers and model switches, with what could leak sampled
along the way (issue 18, the browser soak).

    .venv/bin/python bench/soak_browser.py [--row chromium-compat] [--answers 200] [--switches 20]
                                           [--max-tokens 4] [--gpu force|measure]
                                           [--out bench/results/soak_browser.json]

The built site is opened in the row (--gpu force, the default: with ?gpu=force, so the engine
stays on the row's GPU, whose buffers are what is watched; measure: the page's own engine
choice, which on this machine's software GPUs is the CPU path), the default model loads
and admits; then --answers short greedy answers are asked through the page's worker client,
with a model switch (the same model loaded again: unload, load from the cache, admission)
after every answers/switches of them. After each switch and at the end the worker's
`memory-status` is sampled: the admitted GPU devices still open and their buffers (exact
counts: after a switch, the same as after the first load), Python's live objects after a
collection, and the Wasm heap's size (it only grows: its high-water mark). The figures: each
one's first sample after warm-up (the first switch) against its last, and every answer's
token ids against the first answer to the same question (they must not change).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import platform
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests_browser"), str(ROOT)]

import drivers  # noqa: E402
from app_session import BootedRow, static_site  # noqa: E402

QUESTIONS = ("What is the capital of France?", "Name a colour.", "Say hello.", "What is 2 + 2?")


def switch_model(booted: BootedRow) -> float:
    """The page's load of the default model again (its engine unloaded first), then admission."""
    started = time.monotonic()
    booted.row.eval("window.webslm.loadModel('default').then(() => true)", timeout_s=900)
    booted.wait_for("window.webslm.engine.state === 'GPUReady' || window.webslm.engine.state === 'CPUReady'",
                    timeout_s=900)
    return time.monotonic() - started


def sample(booted: BootedRow, label: str, answers: int) -> dict:
    memory = booted.request("memory-status")
    return {"label": label, "answers": answers, "gpu_devices": memory["gpu"]["devices"],
            "gpu_buffers": memory["gpu"]["buffers"], "python_objects": memory["python_objects"],
            "wasm_heap_bytes": memory["wasm_heap_bytes"]}


def soak(booted: BootedRow, answers: int, switches: int, max_tokens: int) -> dict:
    every = max(1, answers // max(1, switches))
    samples, replies, first_ids, changed, switch_s = [sample(booted, "loaded", 0)], [], {}, [], []
    started = time.monotonic()
    for n in range(answers):
        question = QUESTIONS[n % len(QUESTIONS)]
        request = {"messages": [{"role": "user", "content": question}],
                   "settings": {"temperature": 0, "max_tokens": max_tokens}}
        reply = booted.request("generate", request, timeout_s=900)
        ids = reply["token_ids"]
        if first_ids.setdefault(question, ids) != ids:
            changed.append(n)
        replies.append({"n": n, "backends": reply["backends"], "completion_tokens": reply["usage"]["completion_tokens"],
                        "seconds": reply["timings"].get("total_seconds")})
        if (n + 1) % every == 0 and len(switch_s) < switches:
            switch_s.append(round(switch_model(booted), 2))
            samples.append(sample(booted, f"switch {len(switch_s)}", n + 1))
    samples.append(sample(booted, "end", answers))
    warm, last = samples[1] if len(samples) > 2 else samples[0], samples[-1]
    growth = {key: (last[key] - warm[key]) / warm[key] if warm[key] else None
              for key in ("python_objects", "wasm_heap_bytes")}
    return {"answers": answers, "switches": len(switch_s), "seconds": round(time.monotonic() - started, 1),
            "switch_seconds": switch_s, "samples": samples, "growth_after_warmup": growth,
            "gpu_buffers_flat": len({s["gpu_buffers"] for s in samples}) == 1,
            "gpu_devices": sorted({s["gpu_devices"] for s in samples}),
            "answers_changed_at": changed, "backends": sorted({b for r in replies for b in r["backends"]})}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", default="chromium-compat", choices=drivers.ROW_NAMES)
    ap.add_argument("--answers", type=int, default=200)
    ap.add_argument("--switches", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--gpu", choices=("force", "measure"), default="force")
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as where, static_site(ROOT, pathlib.Path(where)) as port:
        row = drivers.launch(args.row)
        try:
            booted = BootedRow(row, f"http://127.0.0.1:{port}/", query="?gpu=force" if args.gpu == "force" else "")
            booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
            engine = booted.request("engine-status")
            result = soak(booted, args.answers, args.switches, args.max_tokens)
            browser = booted.status["user_agent"]
        finally:
            row.close()
    record = {"bench": "soak_browser", "row": args.row, "gpu": args.gpu, "browser": browser, "engine": engine,
              "max_tokens": args.max_tokens, "machine": platform.platform(), **result}
    g = result["growth_after_warmup"]
    print(f"{args.row} ({engine['backend']}): {result['answers']} answers, {result['switches']} switches in "
          f"{result['seconds']} s; GPU devices {result['gpu_devices']}, buffers flat {result['gpu_buffers_flat']}; "
          f"after warm-up: Python objects {g['python_objects']:+.1%}, Wasm heap {g['wasm_heap_bytes']:+.1%}; "
          f"answers changed at {result['answers_changed_at'] or 'none'}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
