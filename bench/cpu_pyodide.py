"""The CPU path in Pyodide under Node.js (the V8 that Chromium's worker runs, without a
browser): prefill and decode tokens/s per wall second and per CPU second, memory, for this
checkout with its Wasm kernel, without it, and optionally a git revision (the f32 engine
before the quantized one), one after the other in separate Node processes.

    .venv/bin/python bench/cpu_pyodide.py [--tokens 32] [--repeat 2] [--baseline REV] [--numpy]

CPU seconds (process.cpuUsage: the Node process, all its threads) move far less than wall
seconds when other processes share the cores, so both are reported with the load average.
The worker's own loading path is mirrored: the kernel is instantiated on Pyodide's memory
and registered as the JS module "webslm_qmatmul" (worker/qmatmul.mjs). Raw results:
bench/results/cpu_pyodide.json. Needs `node` and the assets (tools/assets.py).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
SITE = ROOT / ".assets/site"
MODEL = SITE / "models/smollm2-135m-instruct-q4.slm"
RESULTS = ROOT / "bench/results/cpu_pyodide.json"

RUNNER = r"""
import { loadPyodide } from "%(pyodide)s";
import fs from "fs";
const args = JSON.parse(process.argv[2]);
const py = await loadPyodide({ indexURL: args.indexURL });
await py.loadPackage(["numpy"], { messageCallback: () => {} });
if (args.wasm) {
  const { loadQmatmul } = await import(args.loader);
  const manifest = { kernels: { qmatmul: { file: "k.wasm", sha256: args.wasmSha256 } } };
  globalThis.fetch = async () => new Response(fs.readFileSync(args.wasm));
  console.error(JSON.stringify(await loadQmatmul(py, manifest, "file:///k/")));
}
py.FS.mkdirTree("/bench");
py.FS.mount(py.FS.filesystems.NODEFS, { root: args.py }, "/bench");
py.FS.writeFile("/model.slm", fs.readFileSync(args.model));
globalThis.cpuSeconds = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
globalThis.wasmHeapBytes = () => py._module.HEAP8.length;
py.globals.set("ARGS", py.toPy(args));
console.log(py.runPython(fs.readFileSync(args.script, "utf8")));
"""

SCRIPT = r"""
import json, sys, time
sys.path.insert(0, "/bench")
import js
import numpy as np
from webslm.artifact.validate import validate_bytes
from webslm.cpu import CpuBackend
try:
    from webslm.cpu import kernels
    kernel = kernels.describe()
except ImportError:
    kernel = "none (f32 weights, numpy)"
model = validate_bytes(bytearray(open("/model.slm", "rb").read()))
began = time.perf_counter()
backend = CpuBackend(model)
build_s = time.perf_counter() - began
ids, runs = list(ARGS["ids"]), []
for r in range(1 + ARGS["repeat"]):
    backend.reset()
    t, c = time.perf_counter(), js.cpuSeconds()
    logits = backend.prefill(ids)
    prefill = (time.perf_counter() - t, js.cpuSeconds() - c)
    tokens = [int(logits.argmax())]
    t, c = time.perf_counter(), js.cpuSeconds()
    for _ in range(ARGS["tokens"]):
        tokens.append(int(backend.decode_one(tokens[-1]).argmax()))
    decode = (time.perf_counter() - t, js.cpuSeconds() - c)
    runs.append({"prefill_s": prefill[0], "prefill_cpu_s": prefill[1], "decode_s": decode[0],
                 "decode_cpu_s": decode[1], "tokens": tokens})
json.dumps({"kernel": kernel, "build_s": build_s, "held_bytes": int(backend.memory_bytes()),
            "wasm_heap_bytes": int(js.wasmHeapBytes()), "runs": runs})
"""


def run_variant(py_dir: pathlib.Path, wasm: pathlib.Path | None, ids: list[int], tokens: int, repeat: int,
                work: pathlib.Path) -> dict:
    import hashlib
    runner, script = work / "runner.mjs", work / "script.py"
    runner.write_text(RUNNER % {"pyodide": (SITE / "pyodide/pyodide.mjs").as_uri()})
    script.write_text(SCRIPT)
    args = {"indexURL": str(SITE / "pyodide") + "/", "py": str(py_dir), "model": str(MODEL), "script": str(script),
            "ids": ids, "tokens": tokens, "repeat": repeat, "loader": (ROOT / "worker/qmatmul.mjs").as_uri(),
            "wasm": str(wasm) if wasm else None,
            "wasmSha256": hashlib.sha256(wasm.read_bytes()).hexdigest() if wasm else None}
    load = os.getloadavg()
    proc = subprocess.run(["node", str(runner), json.dumps(args)], capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"node failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    raw["loadavg_before"], raw["loadavg_after"], raw["loader"] = load, os.getloadavg(), proc.stderr.strip()[-300:]
    warm = raw["runs"][1:] or raw["runs"]
    n = len(ids)
    raw["summary"] = {
        "prefill_tok_s": n / min(r["prefill_s"] for r in warm),
        "prefill_tok_per_cpu_s": n / min(r["prefill_cpu_s"] for r in warm),
        "decode_tok_s": tokens / min(r["decode_s"] for r in warm),
        "decode_tok_per_cpu_s": tokens / min(r["decode_cpu_s"] for r in warm),
        "decode_cold_tok_s": tokens / raw["runs"][0]["decode_s"],
    }
    return raw


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens decoded per run")
    ap.add_argument("--repeat", type=int, default=2, help="warm runs after the cold one")
    ap.add_argument("--baseline", metavar="REV", help="also the CPU path of git revision REV")
    ap.add_argument("--numpy", action="store_true", help="also this checkout without the kernel")
    ap.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = ap.parse_args(argv)
    if not shutil.which("node"):
        print("node not found", file=sys.stderr)
        return 2
    ids = list(range(1000, 1042))              # 42 prompt ids, as bench/cpu_browser.py's prompt
    manifest = json.loads((SITE / "manifest.json").read_text())
    site_wasm = SITE / manifest["kernels"]["qmatmul"]["file"] if "kernels" in manifest else None
    # this checkout runs its own build of the kernel when there is one (tools/build_kernels.py),
    # a baseline revision the site's
    own = ROOT / "py/webslm/cpu/build/webslm_qmatmul.wasm"
    wasm = own if own.is_file() else site_wasm
    results = {"prompt_tokens": len(ids), "decode_tokens": args.tokens, "node": subprocess.run(
        ["node", "--version"], capture_output=True, text=True).stdout.strip(), "cpus": os.cpu_count(), "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        variants = [("this checkout, Wasm kernel", ROOT / "py", wasm)]
        if args.numpy:
            variants.append(("this checkout, numpy (no kernel)", ROOT / "py", None))
        if args.baseline:
            (work / "base").mkdir()
            archive = subprocess.run(["git", "archive", args.baseline, "py"], cwd=ROOT, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(work / "base")], input=archive, check=True)
            # a revision with the Wasm kernel's source runs with the site's build of it
            has_kernel = subprocess.run(["git", "cat-file", "-e", f"{args.baseline}:py/webslm/cpu/qmatmul.c"],
                                        cwd=ROOT).returncode == 0
            variants.append((f"git {args.baseline}", work / "base/py", site_wasm if has_kernel else None))
        print("| variant | kernel | prefill tok/s (per CPU s) | decode tok/s (per CPU s) | held MiB | Wasm heap MiB | load avg |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for label, py_dir, kernel in variants:
            raw = run_variant(py_dir, kernel, ids, args.tokens, args.repeat, work)
            results["variants"][label] = raw
            s = raw["summary"]
            print(f"| {label} | {raw['kernel']} | {s['prefill_tok_s']:.1f} ({s['prefill_tok_per_cpu_s']:.1f}) | "
                  f"{s['decode_tok_s']:.2f} ({s['decode_tok_per_cpu_s']:.2f}) | {raw['held_bytes'] / 2**20:.0f} | "
                  f"{raw['wasm_heap_bytes'] / 2**20:.0f} | {raw['loadavg_before'][0]:.1f}-{raw['loadavg_after'][0]:.1f} |",
                  flush=True)
    tokens = {label: v["runs"][0]["tokens"] for label, v in results["variants"].items()}
    results["greedy_tokens"] = tokens
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
