"""Worker boot time and GPU check time per browser row, cold and warm.

    .venv/bin/python bench/boot.py [--rows chromium,firefox] [--warm 3] [--out bench/results/boot.json]

Cold: a freshly launched browser with an empty profile opens the page; the worker loads
Pyodide, numpy and the webslm wheel over loopback from serve.py. Warm: the same page
reloaded in the same profile (HTTP cache and compiled-Wasm cache populated), repeated
--warm times; the median is reported. The worker measures its own phases with
performance.now(); page_to_ready_s is the wall time from navigation to "ready" seen from
Python. The GPU check is the worker's gpu-probe request (adapter, device, 9 mat-vec cases).

Figures depend on the machine: record it with the results (docs/RESULTS.md does).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests_browser"), str(ROOT)]

import drivers  # noqa: E402
import serve  # noqa: E402
from app_session import BootedRow, serve_in_thread  # noqa: E402

PHASES = ("pyodide_ms", "numpy_ms", "webslm_ms", "total_ms", "page_to_ready_s")


def measure_row(name: str, url: str, warm_runs: int) -> dict:
    row = drivers.launch(name)
    try:
        booted = BootedRow(row, url)                      # the cold boot
        gpu = booted.request("gpu-probe", {"featureLevel": "auto", "seed": 0})
        for i in range(warm_runs):
            booted.boot(f"warm{i}")
        warm = [booted.results[f"boot_warm{i}"] for i in range(warm_runs)]
        adapter = gpu.get("adapter")
        return {
            "row": name,
            "browser": booted.status["user_agent"],
            "cold": booted.results["boot_cold"],
            "warm_median": {k: statistics.median(w[k] for w in warm) for k in PHASES} if warm else None,
            "adapter": None if adapter is None else {
                "vendor": adapter["vendor"], "architecture": adapter["architecture"],
                "description": adapter["description"], "is_fallback": adapter["is_fallback"],
                "feature_level": gpu["feature_level"], "tier": gpu["tier"],
                "features": adapter["features"],
                "maxStorageBufferBindingSize": adapter["limits"]["maxStorageBufferBindingSize"],
                "maxBufferSize": adapter["limits"]["maxBufferSize"],
                "maxComputeWorkgroupStorageSize": adapter["limits"]["maxComputeWorkgroupStorageSize"],
                "maxComputeInvocationsPerWorkgroup": adapter["limits"]["maxComputeInvocationsPerWorkgroup"],
            },
            "gpu_check": {"outcome": gpu["outcome"], "seconds": gpu.get("seconds")},
        }
    finally:
        row.close()


def markdown(results: list[dict]) -> str:
    lines = ["| row | cold: Pyodide / numpy / webslm / total (ms) | cold page->ready (s) | warm median total (ms) | warm page->ready (s) | GPU check |",
             "|---|---|---|---|---|---|"]
    for r in results:
        c, w = r["cold"], r["warm_median"] or {}
        gpu = "no adapter" if r["adapter"] is None else f"{r['gpu_check']['outcome']} in {r['gpu_check']['seconds']} s"
        lines.append(f"| {r['row']} | {c['pyodide_ms']} / {c['numpy_ms']} / {c['webslm_ms']} / {c['total_ms']} "
                     f"| {c['page_to_ready_s']} | {w.get('total_ms', '-')} | {w.get('page_to_ready_s', '-')} | {gpu} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(n for n in drivers.ROW_NAMES if not drivers.missing_binaries(n)))
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "boot.json")
    args = ap.parse_args(argv)
    server, url = serve_in_thread(serve.url_map(ROOT))
    results = []
    try:
        for name in [n for n in args.rows.split(",") if n]:
            print(f"boot: {name} ...", file=sys.stderr, flush=True)
            results.append(measure_row(name, url, args.warm))
    finally:
        server.shutdown()
    record = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.platform(),
              "cpus": len(os.sched_getaffinity(0)), "warm_runs": args.warm, "rows": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
