"""What JSON-schema mode's token mask costs a step, on a model's own vocabulary (SmolLM2's
49152 tokens by default): each schema of tests/json_schemas.py answered on the CPU path
and of its KEYWORD_SCHEMAS (pattern, format, minLength/maxLength, integer bounds: strings
walked over every token, not only the few thousand that are not plain text) answered on the
CPU path (greedy, the model's own answer), timing every mask (`Answer.allowed`) and every advance of
the recognizer, cold (no mask of this schema cached yet) and warm (the same request again:
every state's mask cached). Also the once-per-tokenizer cost of sorting its pieces.

The mask and advance times are the calling thread's CPU time (time.thread_time: pure Python
on one thread), so that other work on a shared machine does not inflate them; the answer's
time per token (prefill included) is wall time.

    PYTHONPATH=py .venv/bin/python bench/schema_mask.py [--model PATH] [--tokens 48]

Writes bench/results/schema_mask.json. Times only: the answers are checked by
tests/test_json_schema.py."""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))
sys.path.insert(0, str(ROOT / "tests"))

import webslm  # noqa: E402
from json_schemas import KEYWORD_SCHEMAS, SCHEMAS  # noqa: E402
from webslm.answer import Answer  # noqa: E402
from webslm.cpu import CpuBackend  # noqa: E402
from webslm.generate import generate  # noqa: E402
from webslm.request import prompt_ids, sampler_settings  # noqa: E402
from webslm.semantic.token_mask import TokenPieces  # noqa: E402

# Grammar mode (semantic/gbnf.py): text grammars walk every token in every state (no string
# block to skip), so their masks cost more than a schema's.
GRAMMARS = [
    {"name": "grammar-answer", "prompt": "Is water wet? Answer yes or no.",
     "grammar": 'root ::= "The answer is " ("yes" | "no" | [1-9] [0-9]{0,2}) "."'},
    {"name": "grammar-csv", "prompt": "Write CSV rows of three fruits and their colours.",
     "grammar": 'root ::= row ("\\n" row){0,2}\nrow ::= cell ("," cell)*\ncell ::= [a-z0-9 ]+ | "\\"" [^"\\n]* "\\""'},
    {"name": "grammar-arithmetic", "prompt": "Write an arithmetic expression equal to 10.",
     "grammar": 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= factor ("*" factor)*\n'
                'factor ::= "0" | [1-9] [0-9]{0,2} | "(" expr ")"'},
]


def timed_answer(model, backend, case, tokens: int) -> dict:
    """One greedy answer with Answer.allowed and the recognizer's advance timed per call."""
    mask_s, advance_s = [], []
    allowed, advance = Answer.allowed, Answer._advance_grammar

    def timed_allowed(self):
        started = time.thread_time()
        try:
            return allowed(self)
        finally:
            mask_s.append(time.thread_time() - started)

    def timed_advance(self, token):
        started = time.thread_time()
        try:
            return advance(self, token)
        finally:
            advance_s.append(time.thread_time() - started)

    form = ({"type": "grammar", "grammar": case["grammar"]} if "grammar" in case else
            {"type": "json_schema", "json_schema": {"name": case["name"], "schema": case["schema"]}})
    settings = sampler_settings(model, {"response_format": form, "temperature": 0, "max_tokens": tokens})
    ids = prompt_ids(model, [{"role": "system", "content": "Answer with JSON only."},
                             {"role": "user", "content": case["prompt"]}])
    Answer.allowed, Answer._advance_grammar = timed_allowed, timed_advance
    try:
        started = time.perf_counter()
        deltas = list(generate(model, backend, ids, settings))
        total = time.perf_counter() - started
    finally:
        Answer.allowed, Answer._advance_grammar = allowed, advance
    ms = lambda xs: round(1000 * sum(xs) / max(len(xs), 1), 3)           # noqa: E731
    return {"tokens": len(mask_s), "finish_reason": deltas[-1].finish_reason,
            "mask_ms_per_token": ms(mask_s), "mask_ms_max": round(1000 * max(mask_s, default=0), 3),
            "advance_ms_per_token": ms(advance_s), "answer_ms_per_token": round(1000 * total / max(len(mask_s), 1), 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=str(ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"))
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    model = webslm.open_model(args.model)
    backend = CpuBackend(model)
    started = time.thread_time()
    TokenPieces(model.tokenizer, model.architecture.vocab)
    pieces_s = time.thread_time() - started
    rows = {}
    for case in SCHEMAS + KEYWORD_SCHEMAS + GRAMMARS:
        cold = timed_answer(model, backend, case, args.tokens)
        warm = timed_answer(model, backend, case, args.tokens)
        rows[case["name"]] = {"cold": cold, "warm": warm}
        print(f"{case['name']:>16}: {cold['tokens']:3d} tokens ({cold['finish_reason']}), mask cold "
              f"{cold['mask_ms_per_token']:7.2f} ms/token (max {cold['mask_ms_max']:.1f}), warm "
              f"{warm['mask_ms_per_token']:6.3f}; advance {cold['advance_ms_per_token']:.3f} (CPU ms); answer "
              f"{cold['answer_ms_per_token']:.1f} ms a token (wall, prefill included)", flush=True)
    schema_names = [case["name"] for case in SCHEMAS]
    mean = lambda key, which, names=schema_names: round(sum(rows[n][which][key] for n in names) / len(names), 3)  # noqa: E731
    keyword_names = [case["name"] for case in KEYWORD_SCHEMAS]
    grammar_names = [case["name"] for case in GRAMMARS]
    out = {"model": pathlib.Path(args.model).name, "vocab": model.architecture.vocab,
           "token_pieces_s": round(pieces_s, 3), "schemas": rows,
           "mean_mask_ms_per_token_cold": mean("mask_ms_per_token", "cold"),
           "mean_mask_ms_per_token_warm": mean("mask_ms_per_token", "warm"),
           "mean_answer_ms_per_token": mean("answer_ms_per_token", "cold"),
           "keyword_schemas_mean_mask_ms_per_token_cold": mean("mask_ms_per_token", "cold", keyword_names),
           "keyword_schemas_mean_mask_ms_per_token_warm": mean("mask_ms_per_token", "warm", keyword_names),
           "grammars_mean_mask_ms_per_token_cold": mean("mask_ms_per_token", "cold", grammar_names),
           "grammars_mean_mask_ms_per_token_warm": mean("mask_ms_per_token", "warm", grammar_names)}
    print(json.dumps({k: v for k, v in out.items() if k != "schemas"}))
    path = ROOT / "bench/results/schema_mask.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
