"""The chat page as a user meets it: time until it is ready to chat, and time to the first
token of an answer, per browser row (engine), on the first visit and on later ones.

    .venv/bin/python bench/page.py [--rows chromium,firefox] [--visits 3] [--link-mb-s 10] [--out bench/results/page.json]

The site is the static build (`serve.py --build`) served by `python -m http.server` over
loopback, as users deploy it. Each row starts with an empty profile:
  first visit   the page downloads Pyodide, numpy, the wheel and the model (97.8 MB), validates
                it, caches it, admits it on the GPU (or sets up the CPU path), then answers;
  later visits  the same profile opens the page again (--visits - 1 times): the model comes
                from Cache Storage (validated again), the rest through the service worker.
"Ready" is the page's own window.webslm.timings.page_ready_s (from navigation start to the
first moment it can answer). The question is "What is the capital of France?", greedy,
in a new chat, sent the way the Send button sends it; its first token is timed by the page
(send to first text shown) and by the worker (time_to_first_token_s: prompt to first token).
Figures depend on the machine and its software adapters: the record names them. --link-mb-s
serves the site through tests_browser/offline_proxy.py at that speed (the responses share it),
as a user's network: over loopback a 98 MB model arrives in well under a second.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests_browser"), str(ROOT)]

import drivers  # noqa: E402
from app_session import static_site  # noqa: E402
from offline_proxy import OfflineProxy  # noqa: E402

QUESTION = "What is the capital of France?"
READY_TIMEOUT_S = 900


def visit(row, url: str) -> dict:
    """Open the page, wait until it can answer, ask once; the page's own timings."""
    started = time.monotonic()
    row.open(url)
    row.eval("new Promise((ok, fail) => { const t = setInterval(() => { if (window.webslm && window.webslm.ready) { clearInterval(t); ok(true); } }, 50);"
             f" setTimeout(() => fail(new Error('not ready')), {READY_TIMEOUT_S * 1000}); }})", timeout_s=READY_TIMEOUT_S + 10)
    ready_wall = time.monotonic() - started
    engine = row.eval("window.webslm.engine")
    answer = row.eval(f"(window.webslm.newChat(), window.webslm.ask({json.dumps(QUESTION)}, {{temperature: 0, max_tokens: 24}}))",
                      timeout_s=READY_TIMEOUT_S)
    t = answer["timings"]
    admission = row.eval("window.webslm.admission") or {}
    return {
        "backend": engine["backend"], "tier": engine["tier"], "model_source": engine["model"]["source"],
        # where "ready" went: the worker's boot, reading + validating the model, GPU admission
        "boot_s": round(engine["worker"]["boot"]["total_ms"] / 1000, 2),
        "model_s": engine["model"]["total_seconds"],
        "gpu_warm_up": engine.get("gpuWarmUp"),                   # paid beside the model's load (prepare-gpu)
        "admission_s": admission.get("seconds"),
        "admission_stage_s": admission.get("stage_seconds"),      # admitted only: where it went
        "engine_choice_s": admission.get("engine_seconds"),       # the GPU-or-CPU timing after it
        "admission_outcome": (None if not admission else "admitted" if admission.get("admitted")
                              else f"{admission.get('code')} at {admission.get('stage')}"),
        "choice": engine.get("choice"),                           # the GPU-or-CPU numbers
        "page_ready_s": round(row.eval("window.webslm.timings.page_ready_s"), 2),
        "page_ready_wall_s": round(ready_wall, 2),
        "page_first_token_s": round(t["page_time_to_first_token_s"], 2),
        "worker_first_token_s": t["time_to_first_token_s"],
        "decode_tokens_per_s": t["decode_tokens_per_s"],
        "answer": answer["text"],
    }


def measure_row(name: str, url: str, visits: int) -> dict:
    row = drivers.launch(name)
    try:
        runs = [visit(row, url) for _ in range(visits)]
        return {"row": name, "runs": runs}
    finally:
        row.close()


def markdown(results: list[dict]) -> str:
    lines = ["| row (engine) | first visit: ready / first token (s) | later visits, median: ready / first token (s) | decode tokens/s |",
             "|---|---|---|---|"]
    for r in results:
        first, later = r["runs"][0], r["runs"][1:]
        engine = first["backend"].upper() + (f" tier {first['tier']}" if first["tier"] else "")
        later_text = "-"
        if later:
            ready = statistics.median(run["page_ready_s"] for run in later)
            token = statistics.median(run["page_first_token_s"] for run in later)
            later_text = f"{ready:.1f} / {token:.1f}"
        lines.append(f"| {r['row']} ({engine}) | {first['page_ready_s']:.1f} / {first['page_first_token_s']:.1f} "
                     f"| {later_text} | {first['decode_tokens_per_s']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(n for n in drivers.ROW_NAMES if not drivers.missing_binaries(n)))
    ap.add_argument("--visits", type=int, default=3)
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "page.json")
    ap.add_argument("--link-mb-s", type=float, help="serve through a link of this many MB/s (all responses share it)")
    args = ap.parse_args(argv)
    results = []
    for name in [n for n in args.rows.split(",") if n]:
        # a server (so an origin, so a Cache Storage) of its own for each row: each first visit is a first
        with tempfile.TemporaryDirectory() as tmp, static_site(ROOT, pathlib.Path(tmp)) as port:
            print(f"page: {name} ...", file=sys.stderr, flush=True)
            link = OfflineProxy(port, bytes_per_second=args.link_mb_s * 1e6) if args.link_mb_s else None
            try:
                results.append(measure_row(name, link.url if link else f"http://127.0.0.1:{port}/", args.visits))
            finally:
                if link:
                    link.close()
    record = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.platform(),
              "link_mb_s": args.link_mb_s,
              "cpus": len(os.sched_getaffinity(0)), "question": QUESTION, "visits": args.visits, "rows": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
