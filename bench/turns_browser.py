"""Time to first token over the turns of one conversation in a browser row's worker, with and
without KV-cache reuse: bench/turns.py's conversation, sent as the page sends it.

    .venv/bin/python bench/turns_browser.py [--row chromium] [--gpu 0] [--turns 5] [--max-tokens 48]
                                            [--out bench/results/turns_browser.json]

The built site (`serve.py --build`, served by `python -m http.server`) is opened in the row with
`?gpu=0` (the CPU path: numpy in Pyodide; --gpu 1 leaves the page's choice), the model loads,
and the worker answers each turn's whole conversation (`generate` requests through the page's
worker client, greedy) once with `cache_prompt: true` and once, in a new conversation,
with `cache_prompt: false`. The figures are the worker's: time from the request to the first
text delta, prefill seconds, prompt tokens and tokens kept; the page's wall time to the reply
is there too.
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
sys.path[:0] = [str(ROOT / "tests_browser"), str(ROOT), str(ROOT / "bench")]

import drivers  # noqa: E402
from app_session import BootedRow, static_site  # noqa: E402
from turns import QUESTIONS  # noqa: E402


def conversation(booted: BootedRow, reuse: bool, turns: int, max_tokens: int) -> list[dict]:
    messages, rows = [], []
    for turn in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
        request = {"messages": messages, "settings": {"temperature": 0, "max_tokens": max_tokens, "cache_prompt": reuse}}
        started = time.monotonic()
        reply = booted.request("generate", request, timeout_s=1800)
        wall = time.monotonic() - started
        t, usage = reply["timings"], reply["usage"]
        rows.append({"turn": turn + 1, "prompt_tokens": usage["prompt_tokens"],
                     "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                     "prefill_s": t["prefill_seconds"], "time_to_first_token_s": t["time_to_first_token_s"],
                     "completion_tokens": usage["completion_tokens"], "decode_tokens_per_s": t["decode_tokens_per_s"],
                     "reply_wall_s": round(wall, 2), "backends": reply["backends"], "answer": reply["text"],
                     "token_ids": reply["token_ids"]})
        messages.append({"role": "assistant", "content": reply["text"]})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", default="chromium", choices=drivers.ROW_NAMES)
    ap.add_argument("--gpu", type=int, choices=(0, 1), default=0)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as where, static_site(ROOT, pathlib.Path(where)) as port:
        row = drivers.launch(args.row)
        try:
            booted = BootedRow(row, f"http://127.0.0.1:{port}/" + ("" if args.gpu else "?gpu=0"))
            booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
            engine = booted.request("engine-status")
            variants = {"reuse": conversation(booted, True, args.turns, args.max_tokens),
                        "fresh": conversation(booted, False, args.turns, args.max_tokens)}
            browser = booted.status["user_agent"]
        finally:
            row.close()
    differ = [a["turn"] for a, b in zip(variants["reuse"], variants["fresh"]) if a["token_ids"] != b["token_ids"]]
    record = {"bench": "turns_browser", "row": args.row, "browser": browser, "engine": engine,
              "max_tokens": args.max_tokens, "machine": platform.platform(),
              "answers_differ_at_turns": differ, "variants": variants}
    print(f"{args.row} ({engine['backend']}): turn  prompt  kept  first token reuse / fresh (s)")
    for a, b in zip(variants["reuse"], variants["fresh"]):
        print(f"  {a['turn']:>4}  {a['prompt_tokens']:>6}  {a['cached_tokens']:>4}  "
              f"{a['time_to_first_token_s']} / {b['time_to_first_token_s']}")
    print("answers differ at turns:", differ or "none")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
