"""Prefill and decode tokens/s of webslm's numpy CPU engine vs llama.cpp on the same model.

    .venv/bin/python bench/cpu.py [--repeat 3] [--prompt-tokens 128] [--decode 64] [--skip-peer]
                                  [--numpy] [--baseline REV]

--numpy also runs this checkout's CPU path without its compiled kernel (WEBSLM_QMATMUL=off:
every product decoded strip by strip for numpy); --baseline REV also runs the CPU path of git
revision REV (its py/ tree, from `git archive`), e.g. the f32 engine before the quantized
one, so that before and after are measured in the same conditions. Every variant of ours runs
in its own subprocess (its own peak RSS), one after the other; CPU seconds are recorded
beside wall seconds, since a shared machine's load moves wall times more.

Ours: webslm.cpu.CpuBackend on the converted .slm (.assets/site/models/smollm2-135m-instruct-q4.slm).
Peer: llama.cpp through llama-cpp-python, on the GGUF the .slm was converted from
(.assets/cache/SmolLM2-135M-Instruct.Q4_1.gguf), run in a subprocess of .venv-peer/bin/python
(build it with tools/build_peer.sh) with n_threads=2, n_ctx=512, logits_all=False.

Both runtimes get the SAME token ids: a ChatML prompt of ~128 tokens made with webslm's tokenizer.
Per runtime: run 0 is cold (the first prefill after construction), runs 1..repeat are warm
(reset, then the same prompt again); each run prefills the prompt in one call, then decodes
--decode greedy tokens one at a time (argmax of the last logits, included in the timing; EOS does
not stop the loop). Printed: the fastest warm prefill and the fastest warm decode; every run is in
bench/results/cpu.json. Memory: peak RSS of the process (VmHWM; each runtime in its own process;
llama.cpp's includes the pages of its mmap'd GGUF that were touched) and, for ours, the bytes held by the backend's arrays (CpuBackend.memory_bytes()), for llama.cpp the model's tensor
bytes plus its context state (llama_model_size + llama_state_get_size).
"""
from __future__ import annotations

import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SLM = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"
GGUF = ROOT / ".assets/cache/SmolLM2-135M-Instruct.Q4_1.gguf"
PEER_PYTHON = ROOT / ".venv-peer/bin/python"
RESULTS = ROOT / "bench/results/cpu.json"
MiB = 1 << 20

# A fixed English paragraph; words are taken from it (cycling) until the rendered chat prompt has
# at least --prompt-tokens tokens.
PARAGRAPH = (
    "The old lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a lamp, a "
    "notebook and a thermos of strong tea. From the gallery he could see the fishing boats returning "
    "to the harbour, the gulls circling over the nets, and the long grey line of the coast fading "
    "into mist. He wrote down the wind, the tide, the colour of the sky and the names of the boats "
    "that passed, as his father had done before him. Summarise his routine in three short sentences, "
    "then explain why such records might still be useful to sailors and scientists today."
)

# Runs inside .venv-peer: reads {"model", "ids", "decode", "repeat", "n_threads", "n_ctx"} on stdin,
# prints one JSON object on stdout.
PEER_SCRIPT = r'''
import json, resource, sys, time
def peak_rss_bytes():  # VmHWM: ru_maxrss would carry the parent's peak across fork+exec
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
args = json.load(sys.stdin)
rss_start = peak_rss_bytes()
import numpy as np
import llama_cpp
from llama_cpp import Llama
t = time.perf_counter()
llm = Llama(model_path=args["model"], n_ctx=args["n_ctx"], n_batch=args["n_ctx"],
            n_threads=args["n_threads"], n_threads_batch=args["n_threads"],
            logits_all=False, verbose=False)
load_s = time.perf_counter() - t
n_vocab = llm.n_vocab()
def last_logits():
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
ids = args["ids"]
runs = []
for r in range(1 + args["repeat"]):
    if r:
        llm.reset()
    t, c = time.perf_counter(), time.process_time()
    llm.eval(ids)
    tok = int(np.argmax(last_logits()))
    prefill_s, prefill_cpu_s = time.perf_counter() - t, time.process_time() - c
    out = [tok]
    t, c = time.perf_counter(), time.process_time()
    for _ in range(args["decode"]):
        llm.eval([tok])
        tok = int(np.argmax(last_logits()))
        out.append(tok)
    decode_s, decode_cpu_s = time.perf_counter() - t, time.process_time() - c
    runs.append({"prefill_s": prefill_s, "decode_s": decode_s, "prefill_cpu_s": prefill_cpu_s,
                 "decode_cpu_s": decode_cpu_s, "tokens": out})
print(json.dumps({
    "version": llama_cpp.__version__,
    "system_info": llama_cpp.llama_print_system_info().decode().strip(),
    "load_s": load_s,
    "runs": runs,
    "rss_start_bytes": rss_start,
    "peak_rss_bytes": peak_rss_bytes(),
    "held_bytes": int(llama_cpp.llama_model_size(llm.model)) + int(llama_cpp.llama_state_get_size(llm.ctx)),
}))
'''

BUILD_HINT = (f"llama.cpp peer not found at {PEER_PYTHON.relative_to(ROOT)}.\n"
              "Build it once (~15-25 min on 2 cores; llama-cpp-python==0.3.36 from the cached sdist):\n"
              "    tools/build_peer.sh            # log: tools/build_peer.sh > /tmp/build_peer.log 2>&1\n"
              "then rerun this bench, or pass --skip-peer to measure ours only.")


def peak_rss_bytes() -> int:
    """This process's peak RSS: VmHWM from /proc (per address space, so a child started by
    fork+exec does not inherit its parent's peak, which ru_maxrss does on Linux), else ru_maxrss."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def blas_info() -> dict:
    """Which BLAS numpy uses, its threads, and the OpenBLAS environment (reported, never changed)."""
    import numpy as np
    info: dict = {"numpy": np.__version__,
                  "env": {k: v for k, v in os.environ.items()
                          if k.startswith(("OPENBLAS", "OMP_", "MKL_", "GOTO"))}}
    try:
        from threadpoolctl import threadpool_info
        info["threadpools"] = [{k: p.get(k) for k in ("user_api", "internal_api", "version",
                                                      "num_threads", "architecture")}
                               for p in threadpool_info()]
    except ImportError:
        try:
            blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
            info["blas"] = {k: blas.get(k) for k in ("name", "version", "openblas configuration")}
        except Exception as e:  # noqa: BLE001 -- numpy < 1.26 has no mode="dicts"
            info["blas"] = f"unknown ({e})"
        info["threadpools"] = "threadpoolctl not installed"
    return info


def blas_line(info: dict) -> str:
    if isinstance(info.get("threadpools"), list):
        parts = [f"{p['internal_api']} {p['version']} ({p['architecture']}, {p['num_threads']} threads)"
                 for p in info["threadpools"]]
        blas = "; ".join(parts) or "none loaded"
    else:
        b = info.get("blas")
        blas = f"{b.get('name')} {b.get('version')}" if isinstance(b, dict) else str(b)
    env = " ".join(f"{k}={v}" for k, v in sorted(info["env"].items())) or "no OPENBLAS_/OMP_ variables set"
    return f"numpy {info['numpy']}, BLAS: {blas}; {env}"


def prompt_ids(model, target: int) -> list[int]:
    """The shortest ChatML prompt (cycling PARAGRAPH's words) of at least `target` tokens."""
    words = PARAGRAPH.split()

    def encode(n: int) -> list[int]:
        content = " ".join(words[i % len(words)] for i in range(n))
        return list(model.tokenizer.encode(model.chat_template.render([{"role": "user", "content": content}])))

    lo, hi = 1, 1
    while len(encode(hi)) < target:
        lo, hi = hi, hi * 2
    while lo < hi:  # the token count grows with the word count
        mid = (lo + hi) // 2
        if len(encode(mid)) >= target:
            hi = mid
        else:
            lo = mid + 1
    return encode(hi)


def run_ours(model, ids: list[int], decode: int, repeat: int) -> dict:
    import numpy as np
    from webslm.cpu import CpuBackend
    t = time.perf_counter()
    backend = CpuBackend(model)
    load_s = time.perf_counter() - t
    runs = []
    for r in range(1 + repeat):
        if r:
            backend.reset()
        t, c = time.perf_counter(), time.process_time()
        tok = int(np.argmax(backend.prefill(ids)))
        prefill_s, prefill_cpu_s = time.perf_counter() - t, time.process_time() - c
        out = [tok]
        t, c = time.perf_counter(), time.process_time()
        for _ in range(decode):
            tok = int(np.argmax(backend.decode_one(tok)))
            out.append(tok)
        decode_s, decode_cpu_s = time.perf_counter() - t, time.process_time() - c
        runs.append({"prefill_s": prefill_s, "decode_s": decode_s, "prefill_cpu_s": prefill_cpu_s,
                     "decode_cpu_s": decode_cpu_s, "tokens": out})
    return {"load_s": load_s, "runs": runs, "peak_rss_bytes": peak_rss_bytes(),
            "held_bytes": int(backend.memory_bytes())}


def run_ours_child() -> int:
    """--child: run_ours with the webslm that PYTHONPATH names, args as JSON on stdin, the
    result as JSON on stdout's last line."""
    import webslm
    args = json.load(sys.stdin)
    model = webslm.open_model(pathlib.Path(args["model"]))
    raw = run_ours(model, args["ids"], args["decode"], args["repeat"])
    try:
        from webslm.cpu import kernels
        raw["kernel"] = kernels.describe()
    except ImportError:
        raw["kernel"] = "none (f32 weights, numpy BLAS)"
    print(json.dumps(raw))
    return 0


def run_ours_in(py_dir: pathlib.Path, model: pathlib.Path, ids: list[int], decode: int, repeat: int,
                env: dict | None = None, timeout_s: float = 3600) -> dict:
    """run_ours in a subprocess importing webslm from py_dir."""
    args = {"model": str(model), "ids": ids, "decode": decode, "repeat": repeat}
    full_env = {**os.environ, "PYTHONPATH": str(py_dir), **(env or {})}
    proc = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()), "--child"], input=json.dumps(args),
                          text=True, capture_output=True, timeout=timeout_s, cwd=ROOT, env=full_env)
    if proc.returncode != 0:
        raise RuntimeError(f"ours ({py_dir}) failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def checkout_py(rev: str, dest: pathlib.Path) -> pathlib.Path:
    """The py/ tree of git revision rev, unpacked under dest, with its own qmatmul kernel
    built there when rev has one (the build is git-ignored, so the archive lacks it; without
    this the baseline would silently fall back to numpy)."""
    paths = ["py"]
    builder = subprocess.run(["git", "cat-file", "-e", f"{rev}:tools/build_kernels.py"], cwd=ROOT).returncode == 0
    if builder:
        paths.append("tools/build_kernels.py")
    archive = subprocess.run(["git", "archive", rev, *paths], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    if builder:
        subprocess.run([sys.executable, str(dest / "tools/build_kernels.py"), "--root", str(dest)], check=True)
    return dest / "py"


def run_peer(ids: list[int], decode: int, repeat: int, n_threads: int = 2, n_ctx: int = 512,
             python: pathlib.Path = PEER_PYTHON, gguf: pathlib.Path = GGUF, timeout_s: float = 1800) -> dict:
    args = {"model": str(gguf), "ids": ids, "decode": decode, "repeat": repeat,
            "n_threads": n_threads, "n_ctx": n_ctx}
    proc = subprocess.run([str(python), "-c", PEER_SCRIPT], input=json.dumps(args), text=True,
                          capture_output=True, timeout=timeout_s, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"llama.cpp peer failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(raw: dict, n_prompt: int, n_decode: int) -> dict:
    """Cold = run 0; warm prefill and decode = the fastest of runs 1.. (run 0 if there are none)."""
    runs = raw["runs"]
    warm = runs[1:] or runs
    pre = [r["prefill_s"] for r in warm]
    dec = [r["decode_s"] for r in warm]
    return {
        "prefill_cold_tok_s": n_prompt / runs[0]["prefill_s"],
        "prefill_warm_tok_s": n_prompt / min(pre),
        "prefill_warm_median_tok_s": n_prompt / statistics.median(pre),
        "decode_cold_tok_s": n_decode / runs[0]["decode_s"],
        "decode_tok_s": n_decode / min(dec),
        "decode_median_tok_s": n_decode / statistics.median(dec),
        "peak_rss_bytes": raw["peak_rss_bytes"],
        "held_bytes": raw.get("held_bytes"),
        "load_s": raw["load_s"],
    }


def _mib(n) -> str:
    return "n/a" if n is None else f"{n / MiB:,.1f} MiB"


def table(rows: list[tuple[str, dict | None, str]]) -> str:
    lines = ["| runtime | prefill tok/s (cold, warm) | decode tok/s | memory (peak RSS; held) |",
             "|---|---:|---:|---:|"]
    for name, s, note in rows:
        if s is None:
            lines.append(f"| {name} | {note} | | |")
            continue
        lines.append(f"| {name} | {s['prefill_cold_tok_s']:,.1f}, {s['prefill_warm_tok_s']:,.1f} | "
                     f"{s['decode_tok_s']:,.2f} | {_mib(s['peak_rss_bytes'])}; {_mib(s['held_bytes'])} |")
    return "\n".join(lines)


def ratios(ours: dict, peer: dict) -> dict:
    keys = ("prefill_cold_tok_s", "prefill_warm_tok_s", "decode_tok_s", "peak_rss_bytes", "held_bytes")
    return {k: (ours[k] / peer[k] if ours.get(k) and peer.get(k) else None) for k in keys}


def agreement(a: list[int], b: list[int]) -> int:
    """How many leading greedy tokens two runtimes share (a correctness cross-check, not a speed one)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    import argparse
    if "--child" in (sys.argv[1:] if argv is None else argv):
        return run_ours_child()                # webslm from PYTHONPATH, as run_ours_in set it
    if str(ROOT / "py") not in sys.path:
        sys.path.insert(0, str(ROOT / "py"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=pathlib.Path, default=SLM, help="our .slm")
    parser.add_argument("--gguf", type=pathlib.Path, default=GGUF, help="the peer's GGUF")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--decode", type=int, default=64, help="greedy tokens decoded per run")
    parser.add_argument("--repeat", type=int, default=3, help="warm runs after the cold one")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp n_threads")
    parser.add_argument("--skip-peer", action="store_true", help="measure ours only")
    parser.add_argument("--skip-ours", action="store_true", help="measure llama.cpp only")
    parser.add_argument("--numpy", action="store_true", help="also ours without the compiled kernel")
    parser.add_argument("--baseline", metavar="REV", help="also the CPU path of git revision REV")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    import webslm
    model = webslm.open_model(args.model)
    ids = prompt_ids(model, args.prompt_tokens)
    n_prompt = len(ids)
    info = blas_info()
    print(f"prompt: {n_prompt} tokens (ChatML, webslm tokenizer); decode: {args.decode} greedy tokens; "
          f"warm runs: {args.repeat}\nours: {blas_line(info)}", flush=True)

    load_before = os.getloadavg()
    if load_before[0] > 0.5:
        print(f"warning: load average {load_before[0]:.2f} before the run: other processes compete for the "
              f"{os.cpu_count()} cores and both runtimes' threads (OpenBLAS, OpenMP) slow down sharply", file=sys.stderr)
    rows: list[tuple[str, dict | None, str]] = []
    result: dict = {"machine": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "model_slm": args.model.name, "model_gguf": args.gguf.name, "prompt_tokens": n_prompt,
                    "decode_tokens": args.decode, "repeat": args.repeat, "ids": ids, "ours_blas": info}
    ours = peer = None
    if not args.skip_ours:
        variants = [("ours", ROOT / "py", {}, "webslm (ours), this checkout")]
        if args.numpy:
            variants.append(("ours_numpy", ROOT / "py", {"WEBSLM_QMATMUL": "off"}, "webslm (ours), no kernel"))
        tmp = None
        if args.baseline:
            import tempfile
            tmp = tempfile.TemporaryDirectory()
            variants.append(("baseline", checkout_py(args.baseline, pathlib.Path(tmp.name)), {},
                             f"webslm at {args.baseline}"))
        for key, py_dir, env, label in variants:
            raw = run_ours_in(py_dir, args.model, ids, args.decode, args.repeat, env)
            summary = summarize(raw, n_prompt, args.decode)
            summary["decode_cpu_tok_s"] = args.decode / min(r["decode_cpu_s"] for r in (raw["runs"][1:] or raw["runs"]))
            rows.append((f"{label} [{raw['kernel']}], CPython {platform.python_version()}", summary, ""))
            result[key] = {"summary": summary, "raw": raw, "loadavg_after": os.getloadavg()}
            print(f"{key}: {raw['kernel']}; load {raw['load_s']:.2f} s, prefill cold {summary['prefill_cold_tok_s']:.1f} "
                  f"tok/s, decode {summary['decode_tok_s']:.2f} tok/s ({summary['decode_cpu_tok_s']:.2f} a CPU "
                  f"second), load average {os.getloadavg()[0]:.2f}", flush=True)
        ours = result["ours"]["summary"]
        if tmp is not None:
            tmp.cleanup()
    if not args.skip_peer:
        if not PEER_PYTHON.exists():
            print(BUILD_HINT, file=sys.stderr)
            rows.append(("llama.cpp (peer)", None, "not built: run tools/build_peer.sh"))
            result["peer"] = {"error": "peer venv missing"}
        else:
            raw = run_peer(ids, args.decode, args.repeat, n_threads=args.threads, gguf=args.gguf)
            peer = summarize(raw, n_prompt, args.decode)
            rows.append((f"llama.cpp {raw['version']} (llama-cpp-python), {args.threads} threads", peer, ""))
            result["peer"] = {"summary": peer, "raw": raw}
    result["loadavg_before"], result["loadavg_after"] = load_before, os.getloadavg()
    print()
    print(table(rows))
    if ours and peer:
        r = ratios(ours, peer)
        result["ratio_ours_over_peer"] = r
        n_agree = agreement(result["ours"]["raw"]["runs"][0]["tokens"], result["peer"]["raw"]["runs"][0]["tokens"])
        result["greedy_tokens_agreeing"] = n_agree
        fmt = lambda x: "n/a" if x is None else f"{x:.3f}x"  # noqa: E731
        print(f"| ratio ours/llama.cpp | {fmt(r['prefill_cold_tok_s'])}, {fmt(r['prefill_warm_tok_s'])} | "
              f"{fmt(r['decode_tok_s'])} | {fmt(r['peak_rss_bytes'])}; {fmt(r['held_bytes'])} |")
        print(f"\ngreedy tokens identical in both runtimes: first {n_agree} of {args.decode + 1}")
    if peer:
        print(f"llama.cpp: {result['peer']['raw']['system_info']}")
    print(f"load average (1 min) before/after: {load_before[0]:.2f} / {result['loadavg_after'][0]:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    try:
        shown = args.out.resolve().relative_to(ROOT)
    except ValueError:
        shown = args.out
    print(f"\nwrote {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
