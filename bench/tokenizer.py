"""Encode throughput of webslm.semantic.tokenizer on a fixed ~1 MB mixed corpus.

    .venv/bin/python bench/tokenizer.py [--repeat 3]

Cold: a freshly emptied word cache (every piece runs BPE). Warm: the same texts again, so
every piece is a cache hit and what is left is splitting, spelling and lookups. Prints a
markdown table and writes bench/results/tokenizer.json.

The corpus and the measurement live in webslm.semantic.corpus, so the Pyodide worker runs
exactly the same code: --rows chromium,firefox adds those runtimes (the page's worker encodes
the corpus with the default model's tokenizer; its token ids must equal CPython's).
"""
from __future__ import annotations

import json
import pathlib
import platform
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests_browser"), str(ROOT), str(ROOT / "py")]

from webslm.semantic.corpus import CORPUS_CHARS, corpus, ids_digest, measure  # noqa: E402

def _table(rows: list[tuple[str, dict]]) -> str:
    lines = ["| runtime | cache | chars | tokens | seconds | chars/s | tokens/s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for runtime, r in rows:
        for label in ("cold", "warm"):
            m = r[label]
            lines.append(f"| {runtime} | {label} | {r['chars']:,} | {m['tokens']:,} | "
                         f"{m['seconds']:.3f} | {m['chars_per_s']:,.0f} | {m['tokens_per_s']:,.0f} |")
    return "\n".join(lines)


def best_of(runs: list[dict]) -> dict:
    best = dict(runs[0])
    for label in ("cold", "warm"):
        best[label] = min((r[label] for r in runs), key=lambda m: m["seconds"])
    return best


def browser_run(name: str, url: str, repeat: int) -> tuple[str, dict, str]:
    """The same corpus and measurement inside the page's Pyodide worker."""
    import drivers
    from app_session import BootedRow
    row = drivers.launch(name)
    try:
        booted = BootedRow(row, url)
        booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
        runs = [booted.request("tokenizer-check", {"chars": CORPUS_CHARS}, timeout_s=900) for _ in range(repeat)]
        python = booted.status["python"]
    finally:
        row.close()
    return f"Pyodide 0.27.7 (Python {python}) in {name}", best_of([r["measure"] for r in runs]), runs[0]["digest"]


def main(argv: list[str] | None = None) -> None:
    import argparse
    import webslm
    import serve
    from app_session import serve_in_thread

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"))
    parser.add_argument("--repeat", type=int, default=3, help="runs; the fastest cold and warm are kept")
    parser.add_argument("--rows", default="", help="browser rows to measure too, e.g. chromium,firefox")
    args = parser.parse_args(argv)

    tokenizer = webslm.open_model(args.model).tokenizer
    texts = corpus()
    rows = [(f"CPython {platform.python_version()}", best_of([measure(tokenizer, texts) for _ in range(args.repeat)]))]
    digest = ids_digest(tokenizer, texts)
    if args.rows:
        server, url = serve_in_thread(serve.url_map(ROOT))
        try:
            for name in args.rows.split(","):
                runtime, best, browser_digest = browser_run(name, url, args.repeat)
                if browser_digest != digest:
                    raise SystemExit(f"{name}: token ids differ from CPython's ({browser_digest} != {digest})")
                rows.append((runtime, best))
        finally:
            server.shutdown()
    print(_table(rows))
    out = ROOT / "bench/results/tokenizer.json"
    out.write_text(json.dumps({"model": pathlib.Path(args.model).name, "machine": platform.platform(),
                               "repeat": args.repeat, "ids_sha256": digest,
                               "rows": [{"runtime": r, "best": b} for r, b in rows]}, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(ROOT)}; token ids identical in every runtime ({digest[:16]}…)")


if __name__ == "__main__":
    main()
