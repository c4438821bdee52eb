"""bench/json_mode_50.py's companion under tight token limits: the same 50 subjects and the same
default model on the CPU path, answered in JSON mode, in JSON-schema mode (json_mode_50's
SCHEMA: bounded strings, an enum, a bounded integer, a boolean; and FREE below: unbounded
strings and an array with minItems) and in grammar mode with a
recursive grammar (tests/test_grammar_mode.py's arithmetic: nested parentheses), each with
max_tokens = the mode's shortest valid answer (closing() of the initial state, in bytes) +
--slack, so most answers are cut by the limit and closed by the mask.

Per mode: answers ended by EOS / by the limit, how many parse (json.loads; for the grammar:
Python's own expression parser, tests/test_grammar_mode.in_arithmetic) and how many are
valid (a JSON object; no error from tests/json_schemas.py's validator; the grammar's
language), and tokens/s over the whole run (wall, prefill included: say what else ran).

    PYTHONPATH=py .venv/bin/python bench/tight_limits.py [--slack 8] [--prompts 50]

Writes bench/results/tight_limits.json, with every answer's text."""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import webslm  # noqa: E402
from json_mode_50 import SCHEMA, SUBJECTS  # noqa: E402
from json_schemas import errors  # noqa: E402
from test_grammar_mode import ARITHMETIC, in_arithmetic  # noqa: E402
from webslm.answer import Timings, grammar_mask  # noqa: E402
from webslm.cpu import CpuBackend  # noqa: E402
from webslm.generate import generate  # noqa: E402
from webslm.request import prompt_ids, sampler_settings  # noqa: E402

# Free strings and an array with minItems: nothing bounds the answer but the limit.
FREE = {"type": "object", "properties": {"name": {"type": "string"}, "summary": {"type": "string"},
                                         "facts": {"type": "array", "items": {"type": "string"}, "minItems": 2}},
        "required": ["name", "summary", "facts"], "additionalProperties": False}
MODES = {
    "json_object": {"type": "json_object"},
    "json_schema": {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}},
    "json_schema (free strings)": {"type": "json_schema", "json_schema": {"name": "facts", "schema": FREE}},
    "grammar (recursive)": {"type": "grammar", "grammar": ARITHMETIC},
}


def ask(mode: str, subject: str) -> list[dict]:
    if mode == "grammar (recursive)":
        text = f"Write a long arithmetic expression, with parentheses, that counts something about {subject}."
    elif mode == "json_object":
        text = f"Describe {subject} as a JSON object with many details."
    elif mode == "json_schema (free strings)":
        text = f"Describe {subject} as JSON with its name, a long detailed summary and many facts."
    else:
        text = (f"Describe {subject} as JSON with its name, category, a one-sentence summary, a rating "
                "from 1 to 10 and whether it is famous.")
    return [{"role": "system", "content": "You answer with JSON only." if mode != "grammar (recursive)" else
             "You answer with arithmetic only."}, {"role": "user", "content": text}]


def check(mode: str, text: str) -> tuple[bool, bool]:
    """(parses, valid) as a consumer of the answer would see them."""
    if mode == "grammar (recursive)":
        ok = in_arithmetic(text)
        return ok, ok
    try:
        value = json.loads(text)
    except ValueError:
        return False, False
    if mode == "json_object":
        return True, isinstance(value, dict)
    return True, errors(value, FREE if "free" in mode else SCHEMA) == []


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slack", type=int, default=8, help="tokens above the shortest valid answer")
    parser.add_argument("--prompts", type=int, default=len(SUBJECTS))
    parser.add_argument("--model", default=str(ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"))
    args = parser.parse_args()
    model = webslm.open_model(args.model)
    backend = CpuBackend(model)
    out = {"model": pathlib.Path(args.model).name, "path": "cpu (numpy)", "host": platform.platform(),
           "date": time.strftime("%Y-%m-%d"), "slack": args.slack, "temperature": 0.7,
           "loadavg_before": os.getloadavg(), "modes": {}}
    for mode, form in MODES.items():
        mask = grammar_mask(model, sampler_settings(model, {"response_format": form}))
        shortest = mask.closing(mask.initial)
        limit = int(shortest) + args.slack
        rows, tokens = [], 0
        started = time.perf_counter()
        for n, subject in enumerate(SUBJECTS[:args.prompts]):
            settings = sampler_settings(model, {"response_format": form, "temperature": 0.7, "seed": n,
                                                "max_tokens": limit})
            timings = Timings()
            deltas = list(generate(model, backend, prompt_ids(model, ask(mode, subject)), settings, timings=timings))
            text = "".join(d.text for d in deltas)
            parsed, ok = check(mode, text)
            tokens += timings.generated_tokens
            rows.append({"subject": subject, "finish_reason": deltas[-1].finish_reason, "parsed": parsed,
                         "valid": ok, "tokens": timings.generated_tokens, "text": text})
            print(f"{mode} {n:2d} {deltas[-1].finish_reason:6s} parsed={parsed!s:5} valid={ok!s:5} "
                  f"{timings.generated_tokens:3d} tok  {text[:90]!r}", flush=True)
        wall = time.perf_counter() - started
        count = len(rows)
        out["modes"][mode] = {
            "shortest_bytes": int(shortest), "max_tokens": limit, "prompts": count,
            "stopped": sum(r["finish_reason"] == "stop" for r in rows),
            "cut_by_limit": sum(r["finish_reason"] == "length" for r in rows),
            "parse_rate": sum(r["parsed"] for r in rows) / count, "valid_rate": sum(r["valid"] for r in rows) / count,
            "generated_tokens": tokens, "wall_s": round(wall, 1), "tokens_per_s_wall": round(tokens / wall, 2),
            "answers": rows}
        print(mode, json.dumps({k: v for k, v in out["modes"][mode].items() if k != "answers"}), flush=True)
    out["loadavg_after"] = os.getloadavg()
    path = ROOT / "bench/results/tight_limits.json"
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
