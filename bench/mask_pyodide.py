"""What the constrained modes' token masks cost a token in Pyodide (the worker's Python, under
Node.js's V8 here) next to CPython on the same machine: JSON mode, the schemas of
tests/json_schemas.py (SCHEMAS and KEYWORD_SCHEMAS) and bench/schema_mask.py's grammars.

Each case is answered once in CPython by the default model on the CPU path (greedy, at most
--tokens tokens, as bench/schema_mask.py does); its committed tokens are then replayed, in
CPython and in Pyodide alike, through a mask made fresh: per token, allowed_within (the mask
the sampler applies, closing within the limit included) and the recognizer's advance. The
first replay is uncached (a new grammar, its step caches and masks empty: what the first
answer with a schema pays), the second cached (every state's mask kept: an app asking with
the same schema again). The tokenizer's sorted pieces (once per tokenizer) are timed apart.
Times are wall seconds of a single-threaded loop (perf_counter) on whatever else the
machine runs: the load average is recorded before and after.

    PYTHONPATH=py .venv/bin/python bench/mask_pyodide.py [--tokens 48]

Writes bench/results/mask_pyodide.json. Needs `node` and the assets (tools/assets.py)."""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

SITE = ROOT / ".assets/site"
MODEL = SITE / "models/smollm2-135m-instruct-q4.slm"
RESULTS = ROOT / "bench/results/mask_pyodide.json"

# The replay, run as it is by CPython and by Pyodide: REPLAY_ARGS {cases, limit}, MODEL_PATH.
REPLAY = r'''
import json, time
from webslm.semantic import gbnf, json_grammar as jg, json_schema as js
from webslm.semantic.token_mask import GrammarMask, TokenPieces


def fresh_grammar(case):
    if case["kind"] == "json_object":
        jg.step.cache_clear()
        return jg.ObjectGrammar
    if case["kind"] == "grammar":
        return gbnf.TextGrammar(gbnf.Grammar(case["text"]))
    return js.compile_schema.__wrapped__(case["text"])


def replay(mask, tokens, tokenizer, limit):
    state, mask_s, advance_s = mask.initial, [], []
    for i, token in enumerate(tokens):
        t = time.perf_counter()
        allowed = mask.allowed_within(state, limit - i - 1)
        mask_s.append(time.perf_counter() - t)
        assert allowed[token], (i, token)
        t = time.perf_counter()
        state = mask.advance(state, tokenizer.piece_bytes(token))
        advance_s.append(time.perf_counter() - t)
    return mask_s, advance_s


def run(tokenizer, vocab, eos, cases, limit):
    t = time.perf_counter()
    pieces = TokenPieces(tokenizer, vocab)
    out = {"token_pieces_s": time.perf_counter() - t, "cases": {}}
    for case in cases:
        mask = GrammarMask(pieces, fresh_grammar(case), eos)
        row = {}
        for which in ("uncached", "cached"):
            mask_s, advance_s = replay(mask, case["tokens"], tokenizer, limit)
            row[which] = {"mask_ms_per_token": 1000 * sum(mask_s) / len(mask_s),
                          "mask_ms_max": 1000 * max(mask_s),
                          "advance_ms_per_token": 1000 * sum(advance_s) / len(advance_s)}
        out["cases"][case["name"]] = row
    return out
'''

PYODIDE_RUNNER = r"""
import { loadPyodide } from "%(pyodide)s";
import fs from "fs";
const args = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const py = await loadPyodide({ indexURL: args.indexURL });
await py.loadPackage(["numpy"], { messageCallback: () => {} });
py.FS.mkdirTree("/bench");
py.FS.mount(py.FS.filesystems.NODEFS, { root: args.py }, "/bench");
py.FS.writeFile("/model.slm", fs.readFileSync(args.model));
py.globals.set("ARGS", py.toPy(args));
console.log(py.runPython(`
import json, sys
sys.path.insert(0, "/bench")
from webslm.artifact.validate import validate_bytes
model = validate_bytes(bytearray(open("/model.slm", "rb").read()))
exec(ARGS["replay"])
json.dumps(run(model.tokenizer, model.architecture.vocab, list(model.manifest.tokenizer["eos_ids"]),
               ARGS["cases"], ARGS["limit"]))
`));
"""


def cases_with_answers(tokens: int) -> list[dict]:
    """Every case and the tokens the default model commits answering it (greedy, CPU path)."""
    import webslm
    from json_schemas import KEYWORD_SCHEMAS, SCHEMAS
    from schema_mask import GRAMMARS
    from webslm.cpu import CpuBackend
    from webslm.generate import generate
    from webslm.request import prompt_ids, sampler_settings
    from webslm.semantic.json_schema import canonical_schema
    from webslm.semantic.ledger import Ledger
    model = webslm.open_model(MODEL)
    backend = CpuBackend(model)
    cases = [{"name": "json_object", "kind": "json_object", "text": "", "prompt": "Describe Paris as a JSON object.",
              "form": {"type": "json_object"}}]
    for case in SCHEMAS + KEYWORD_SCHEMAS:
        cases.append({"name": case["name"], "kind": "json_schema", "text": canonical_schema(case["schema"]),
                      "prompt": case["prompt"], "form": {"type": "json_schema", "json_schema": {
                          "name": case["name"], "schema": case["schema"]}}})
    for case in GRAMMARS:
        cases.append({"name": case["name"], "kind": "grammar", "text": case["grammar"], "prompt": case["prompt"],
                      "form": {"type": "grammar", "grammar": case["grammar"]}})
    for case in cases:
        settings = sampler_settings(model, {"response_format": case.pop("form"), "temperature": 0, "max_tokens": tokens})
        ids = prompt_ids(model, [{"role": "system", "content": "Answer with JSON only."},
                                 {"role": "user", "content": case.pop("prompt")}])
        ledger = Ledger()
        for _ in generate(model, backend, ids, settings, ledger=ledger):
            pass
        case["tokens"] = list(ledger.committed_ids)
    return cases


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    load_before = os.getloadavg()
    cases = cases_with_answers(args.tokens)
    import webslm
    model = webslm.open_model(MODEL)
    scope: dict = {}
    exec(REPLAY, scope)
    cpython = scope["run"](model.tokenizer, model.architecture.vocab, list(model.manifest.tokenizer["eos_ids"]),
                           cases, args.tokens)
    with tempfile.TemporaryDirectory() as tmp:
        runner, given = pathlib.Path(tmp) / "runner.mjs", pathlib.Path(tmp) / "args.json"
        runner.write_text(PYODIDE_RUNNER % {"pyodide": (SITE / "pyodide/pyodide.mjs").as_uri()})
        given.write_text(json.dumps({"indexURL": str(SITE / "pyodide") + "/", "py": str(ROOT / "py"),
                                     "model": str(MODEL), "replay": REPLAY, "cases": cases, "limit": args.tokens}))
        proc = subprocess.run(["node", str(runner), str(given)], capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"node failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    pyodide = json.loads(proc.stdout.strip().splitlines()[-1])
    groups = {"json_object": ["json_object"], "schemas": [c["name"] for c in cases if c["kind"] == "json_schema"],
              "grammars": [c["name"] for c in cases if c["kind"] == "grammar"]}
    summary = {}
    print("| cases | runtime | mask ms/token uncached | cached | advance ms/token | worst mask ms |")
    print("|---|---|---:|---:|---:|---:|")
    for group, names in groups.items():
        for runtime, got in (("CPython", cpython), ("Pyodide", pyodide)):
            rows = [got["cases"][n] for n in names]
            mean = lambda which, key, rows=rows: sum(r[which][key] for r in rows) / len(rows)   # noqa: E731
            line = {"mask_ms_per_token_uncached": round(mean("uncached", "mask_ms_per_token"), 3),
                    "mask_ms_per_token_cached": round(mean("cached", "mask_ms_per_token"), 3),
                    "advance_ms_per_token": round(mean("uncached", "advance_ms_per_token"), 3),
                    "mask_ms_max": round(max(r["uncached"]["mask_ms_max"] for r in rows), 1)}
            summary.setdefault(group, {})[runtime] = line
            print(f"| {group} ({len(names)}) | {runtime} | {line['mask_ms_per_token_uncached']} | "
                  f"{line['mask_ms_per_token_cached']} | {line['advance_ms_per_token']} | {line['mask_ms_max']} |")
    out = {"model": MODEL.name, "max_tokens": args.tokens, "node": subprocess.run(["node", "--version"], capture_output=True,
                                                                                   text=True).stdout.strip(),
           "cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
           "token_pieces_s": {"CPython": round(cpython["token_pieces_s"], 3), "Pyodide": round(pyodide["token_pieces_s"], 3)},
           "summary": summary, "tokens": {c["name"]: len(c["tokens"]) for c in cases},
           "cases": {"CPython": cpython["cases"], "Pyodide": pyodide["cases"]}}
    print(f"token pieces: {out['token_pieces_s']}")
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
