"""What the constrained modes' token masks cost a token in Pyodide (the worker's Python, under
Node.js's V8 here) next to CPython on the same machine, for the three modes: JSON mode and
JSON-schema mode on SmolLM2's own answers recorded by bench/json_mode_50.py (the first
--answers of each, bench/results/json_mode_50.json), the keyword schemas of
tests/json_schemas.py (pattern, format, lengths, integer bounds) and bench/schema_mask.py's
three grammars on valid texts written below.

No model runs: each text is encoded by SmolLM2's tokenizer and its tokens replayed, in
CPython and in Pyodide alike, through a mask made fresh: per token, allowed_within (the mask
the sampler applies, with the closing-within-the-limit groups; the limit is far, so none
cuts) and the recognizer's advance. The first replay is uncached (a new grammar, its step
caches and masks empty: what the first answer with a schema pays), the second cached
(every state's mask kept: an app asking with the same schema again). The tokenizer's sorted
pieces (once per tokenizer) are timed apart. Times are CPU seconds, so that other work on
the shared cores counts less: CPython's calling thread (time.thread_time), Node's process
(process.cpuUsage: V8's helper threads included); the load average is recorded.

    PYTHONPATH=py .venv/bin/python bench/mask_pyodide.py [--answers 10]

Writes bench/results/mask_pyodide.json. Needs `node` and the assets (tools/assets.py)."""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

SITE = ROOT / ".assets/site"
MODEL = SITE / "models/smollm2-135m-instruct-q4.slm"
RESULTS = ROOT / "bench/results/mask_pyodide.json"
LIMIT = 4096                 # the token limit the replay tells allowed_within: far, so nothing is cut

# The replay, run as it is by CPython and by Pyodide (run(): the tokenizer, the cases, the limit).
REPLAY = r'''
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
        t = clock()
        allowed = mask.allowed_within(state, limit - i - 1)
        mask_s.append(clock() - t)
        assert allowed[token], (i, token)
        t = clock()
        state = mask.advance(state, tokenizer.piece_bytes(token))
        advance_s.append(clock() - t)
    return mask_s, advance_s


def run(tokenizer, vocab, eos, cases, limit):
    t = clock()
    pieces = TokenPieces(tokenizer, vocab)
    out = {"token_pieces_s": clock() - t, "cases": {}}
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
globalThis.cpuSeconds = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
py.globals.set("ARGS", py.toPy(args));
console.log(py.runPython(`
import json, sys, js
sys.path.insert(0, "/bench")
clock = js.cpuSeconds
import webslm
model = webslm.open_model("/model.slm")
exec(ARGS["replay"])
json.dumps(run(model.tokenizer, model.architecture.vocab, list(model.manifest.tokenizer["eos_ids"]),
               ARGS["cases"], ARGS["limit"]))
`));
"""


# Valid answers for the keyword schemas and the grammars (the JSON ones are SmolLM2's own).
KEYWORD_ANSWERS = {
    "signup": '{"name": "Ada Lovelace", "born": "1815-12-10", "email": "ada@example.org", "age": 36}',
    "sku": '{"code": "AB-1234", "quantity": 12}',
    "server": '{"id": "123e4567-e89b-12d3-a456-426614174000", "ip": "192.168.1.20", '
              '"booted": "2024-03-01T08:15:00Z"}',
    "tags": '["baking", "quick-meals", "vegan"]',
    "score": '{"score": 2, "why": "A timeless, moving classic.", "model": "smollm2"}',
}
GRAMMAR_ANSWERS = {
    "grammar-answer": "The answer is yes.",
    "grammar-csv": 'apple,red\nbanana,"yellow, sweet"\ncherry,dark red',
    "grammar-arithmetic": "(2+3)*4-(10-8)*(1+1)+12",
}


def replay_cases(answers: int) -> list[dict]:
    """Every case with its text's tokens (SmolLM2's tokenizer)."""
    import webslm
    from json_mode_50 import SCHEMA
    from json_schemas import KEYWORD_SCHEMAS
    from schema_mask import GRAMMARS
    from webslm.semantic.json_schema import canonical_schema
    tokenizer = webslm.open_model(MODEL).tokenizer
    recorded = json.loads((ROOT / "bench/results/json_mode_50.json").read_text())["modes"]
    out = []
    for n, row in enumerate(recorded["json_object"]["answers"][:answers]):
        out.append({"name": f"json_object-{n}", "kind": "json_object", "text": "", "answer": row["text"]})
    for n, row in enumerate(recorded["json_schema"]["answers"][:answers]):
        out.append({"name": f"json_schema-{n}", "kind": "json_schema", "text": canonical_schema(SCHEMA),
                    "answer": row["text"]})
    for case in KEYWORD_SCHEMAS:
        out.append({"name": case["name"], "kind": "json_schema", "text": canonical_schema(case["schema"]),
                    "answer": KEYWORD_ANSWERS[case["name"]]})
    for case in GRAMMARS:
        out.append({"name": case["name"], "kind": "grammar", "text": case["grammar"],
                    "answer": GRAMMAR_ANSWERS[case["name"]]})
    for case in out:
        case["tokens"] = tokenizer.encode(case.pop("answer"), add_special=False)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--answers", type=int, default=10, help="recorded answers per JSON mode")
    args = parser.parse_args()
    load_before = os.getloadavg()
    cases = replay_cases(args.answers)
    import webslm
    model = webslm.open_model(MODEL)
    scope: dict = {"clock": time.thread_time}
    exec(REPLAY, scope)
    cpython = scope["run"](model.tokenizer, model.architecture.vocab, list(model.manifest.tokenizer["eos_ids"]),
                           cases, LIMIT)
    with tempfile.TemporaryDirectory() as tmp:
        runner, given = pathlib.Path(tmp) / "runner.mjs", pathlib.Path(tmp) / "args.json"
        runner.write_text(PYODIDE_RUNNER % {"pyodide": (SITE / "pyodide/pyodide.mjs").as_uri()})
        given.write_text(json.dumps({"indexURL": str(SITE / "pyodide") + "/", "py": str(ROOT / "py"),
                                     "model": str(MODEL), "replay": REPLAY, "cases": cases, "limit": LIMIT}))
        proc = subprocess.run(["node", str(runner), str(given)], capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"node failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    pyodide = json.loads(proc.stdout.strip().splitlines()[-1])
    groups = {"json_object": [c["name"] for c in cases if c["kind"] == "json_object"],
              "json_schema (json_mode_50's)": [c["name"] for c in cases if c["name"].startswith("json_schema-")],
              "keyword schemas": [c["name"] for c in cases if c["kind"] == "json_schema"
                                  and not c["name"].startswith("json_schema-")],
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
    out = {"model": MODEL.name, "limit": LIMIT, "node": subprocess.run(["node", "--version"], capture_output=True,
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
