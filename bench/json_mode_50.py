"""Issue 20's ">= 50 prompts" check of JSON mode: the default model (SmolLM2-135M-Instruct q4)
on the CPU path answers 50 different prompts twice, once with response_format json_object
and once with one JSON schema (SCHEMA below: strings with length bounds, an enum, a bounded
integer and a boolean), each answer seeded (seed = the prompt's number, temperature 0.7) and
at most --tokens new tokens.

Per mode: how many answers ended "stop", how many parse as JSON (json.loads), how many are
valid (json_object: a JSON object; json_schema: tests/json_schemas.py's validator finds no
error) and the tokens per second over the whole run (wall time, prefill included, on
whatever else the machine is doing: say so when quoting it).

    PYTHONPATH=py .venv/bin/python bench/json_mode_50.py [--tokens 160] [--prompts 50]

Writes bench/results/json_mode_50.json, with every answer's text."""
from __future__ import annotations

import argparse
import json
import pathlib
import platform
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))
sys.path.insert(0, str(ROOT / "tests"))

import webslm  # noqa: E402
from json_schemas import errors  # noqa: E402
from webslm.answer import Timings  # noqa: E402
from webslm.cpu import CpuBackend  # noqa: E402
from webslm.generate import generate  # noqa: E402
from webslm.request import prompt_ids, sampler_settings  # noqa: E402

SUBJECTS = [
    "the Eiffel Tower", "a golden retriever", "the planet Mars", "a violin", "the river Nile", "coffee",
    "the city of Tokyo", "a bicycle", "the Moon", "an apple", "the Great Wall of China", "a laptop",
    "the Amazon rainforest", "a piano", "Mount Everest", "a cup of green tea", "the Pacific Ocean",
    "a honeybee", "the Sahara desert", "a chess board", "the Statue of Liberty", "a sunflower",
    "the city of Rome", "a lighthouse", "a penguin", "the Mona Lisa", "a pair of running shoes",
    "the human heart", "a thunderstorm", "a red fox", "the game of football", "a volcano",
    "the city of Cairo", "a smartphone", "an oak tree", "the Arctic", "a guitar", "a dolphin",
    "the Moon landing of 1969", "a loaf of bread", "the city of Sydney", "a rainbow", "an elephant",
    "the Internet", "a snowflake", "a castle", "the Milky Way", "a butterfly", "the Olympic Games",
    "a train",
]

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 2, "maxLength": 40},
    "category": {"enum": ["place", "animal", "plant", "object", "event", "idea"]},
    "summary": {"type": "string", "minLength": 10, "maxLength": 120},
    "rating": {"type": "integer", "minimum": 1, "maximum": 10},
    "famous": {"type": "boolean"}},
    "required": ["name", "category", "summary", "rating", "famous"], "additionalProperties": False}


def modes() -> dict[str, dict]:
    return {"json_object": {"response_format": {"type": "json_object"}},
            "json_schema": {"response_format": {"type": "json_schema",
                                                "json_schema": {"name": "thing", "schema": SCHEMA}}}}


def prompt(mode: str, subject: str) -> list[dict]:
    ask = (f"Describe {subject} as a JSON object." if mode == "json_object" else
           f"Describe {subject} as JSON with its name, category, a one-sentence summary, a rating "
           "from 1 to 10 and whether it is famous.")
    return [{"role": "system", "content": "You answer with JSON only."}, {"role": "user", "content": ask}]


def valid(mode: str, value) -> bool:
    if mode == "json_object":
        return isinstance(value, dict)
    return errors(value, SCHEMA) == []


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--prompts", type=int, default=len(SUBJECTS))
    parser.add_argument("--model", default=str(ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"))
    args = parser.parse_args()
    model = webslm.open_model(args.model)
    backend = CpuBackend(model)
    out = {"model": pathlib.Path(args.model).name, "path": "cpu (numpy)", "host": platform.platform(),
           "date": time.strftime("%Y-%m-%d"), "max_tokens": args.tokens, "temperature": 0.7,
           "schema": SCHEMA, "modes": {}}
    for mode, request in modes().items():
        rows, tokens, prefill_s, decode_s = [], 0, 0.0, 0.0
        started = time.perf_counter()
        for n, subject in enumerate(SUBJECTS[:args.prompts]):
            settings = sampler_settings(model, {**request, "temperature": 0.7, "seed": n, "max_tokens": args.tokens})
            timings = Timings()
            deltas = list(generate(model, backend, prompt_ids(model, prompt(mode, subject)), settings, timings=timings))
            text = "".join(d.text for d in deltas)
            try:
                value, parsed = json.loads(text), True
            except ValueError:
                value, parsed = None, False
            ok = parsed and valid(mode, value)
            tokens += timings.generated_tokens
            prefill_s += timings.prefill_seconds
            decode_s += timings.decode_seconds
            rows.append({"subject": subject, "finish_reason": deltas[-1].finish_reason, "parsed": parsed,
                         "valid": ok, "tokens": timings.generated_tokens, "text": text})
            print(f"{mode} {n:2d} {deltas[-1].finish_reason:6s} parsed={parsed!s:5} valid={ok!s:5} "
                  f"{timings.generated_tokens:3d} tok  {text[:90]!r}", flush=True)
        wall = time.perf_counter() - started
        count = len(rows)
        out["modes"][mode] = {
            "prompts": count, "stopped": sum(r["finish_reason"] == "stop" for r in rows),
            "parse_rate": sum(r["parsed"] for r in rows) / count, "valid_rate": sum(r["valid"] for r in rows) / count,
            "generated_tokens": tokens, "wall_s": round(wall, 1),
            "tokens_per_s_wall": round(tokens / wall, 2),
            "decode_tokens_per_s": round(tokens / decode_s, 2) if decode_s else None,
            "prefill_s": round(prefill_s, 1), "answers": rows}
        summary = {k: v for k, v in out["modes"][mode].items() if k != "answers"}
        print(mode, json.dumps(summary), flush=True)
    path = ROOT / "bench/results/json_mode_50.json"
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
