"""Validation time of the default model: CPython here, and Pyodide in browser workers.

    .venv/bin/python bench/validate.py [--rows chromium,firefox] [--repeat 3]

CPython: validate_file() on .assets/site/models/<default> (8 MiB reads; the file is in the
OS page cache after the first run, so "cold" is the first validation in a fresh process,
not a cold disk). Browser: the page streams the model from serve.py over loopback into the
worker's validator (webslm.worker.loader.ModelLoader); "validation" counts only the time
inside the validator (copying chunks in, hashing, parsing, value scans), "with download"
is the whole load-model request. Every run includes the whole-file and per-tensor sha256.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests_browser"), str(ROOT), str(ROOT / "py")]

import drivers  # noqa: E402
import serve  # noqa: E402
from app_session import BootedRow, serve_in_thread  # noqa: E402

CPYTHON_ONE_RUN = """
import sys, time
from webslm.artifact import validate_file
started = time.perf_counter(); model = validate_file(sys.argv[1]); print(time.perf_counter() - started)
"""


def default_model() -> tuple[pathlib.Path, dict]:
    manifest = json.loads((ROOT / serve.MANIFEST).read_text())
    entry = next(m for m in manifest.get("models", []) if m.get("default"))
    return ROOT / ".assets" / "site" / entry["file"], entry


def cpython_runs(path: pathlib.Path, repeat: int) -> list[float]:
    """Each run in a fresh interpreter (no cached imports or buffers)."""
    return [float(subprocess.run([sys.executable, "-c", CPYTHON_ONE_RUN, str(path)], check=True,
                                 capture_output=True, text=True).stdout) for _ in range(repeat)]


def browser_runs(name: str, url: str, repeat: int) -> dict:
    row = drivers.launch(name)
    try:
        booted = BootedRow(row, url)
        runs = []
        for i in range(repeat):
            if i:
                booted.boot(f"reload{i}")
            model = booted.wait_for("window.webslm && window.webslm.model", timeout_s=600)
            if "error" in model:
                raise RuntimeError(f"{name}: {model['error']}")
            # the first load downloads the model; reloads read it from Cache Storage
            runs.append({"validation_s": model["validation_seconds"], "with_reading_s": model["total_seconds"],
                         "source": model["source"]})
        return {"row": name, "browser": booted.status["user_agent"], "runs": runs}
    finally:
        row.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="chromium")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "validate.json")
    args = ap.parse_args(argv)
    path, entry = default_model()
    record = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.platform(),
              "cpus": len(os.sched_getaffinity(0)), "model": entry, "cpython": cpython_runs(path, args.repeat),
              "browsers": []}
    server, url = serve_in_thread(serve.url_map(ROOT))
    try:
        for name in [n for n in args.rows.split(",") if n]:
            print(f"validate: {name} ...", file=sys.stderr, flush=True)
            record["browsers"].append(browser_runs(name, url, args.repeat))
    finally:
        server.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    size = f"{entry['bytes'] / 2**20:.1f} MiB"
    print(f"| runtime | {entry['id']} ({size}): validation, first / median of {args.repeat} | with reading it (median; the first run downloads, later ones read Cache Storage) |")
    print("|---|---|---|")
    c = record["cpython"]
    print(f"| CPython {platform.python_version()} | {c[0]:.2f} s / {statistics.median(c):.2f} s | – |")
    for b in record["browsers"]:
        v = [r["validation_s"] for r in b["runs"]]
        d = [r["with_reading_s"] for r in b["runs"]]
        print(f"| Pyodide 0.27.7 in {b['row']} worker | {v[0]:.2f} s / {statistics.median(v):.2f} s | {statistics.median(d):.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
