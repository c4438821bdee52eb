"""What JSON and JSON-schema modes cost a decode step on the GPU engine (wgpu-native), side by
side with plain text: a mask needs the whole logits row read back each step (text greedy
reads back 12 bytes, text sampling the top-64 candidates) and the mask computed on the host.

    PYTHONPATH=py python bench/constrained_decode.py --model FILE.slm [--tokens 64] [--out FILE]

One Engine on the native adapter, one prompt ("Answer in JSON: a colour and whether it is
primary."), at most `--tokens` new tokens per answer (an answer may end sooner: the figures
are per token), after one warm-up answer. Rows:
text-greedy, text-sampled (seeded, top_k 40), json-object, json-schema cold (the schema's
masks and the compiled recognizer dropped first) and json-schema warm (the same
request again). Per row: decode ms per token (wall, the engine's decode timer), the mask's
host CPU time per token (time.thread_time around Answer.allowed) and what the engine read
back. Random weights are fine for the readback and the loop; the mask's cost depends on the
tokenizer (SmolLM2's real one: bench/schema_mask.py).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import platform
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

import webslm  # noqa: E402
from webslm.admission.admit import AdmissionPolicy  # noqa: E402
from webslm.answer import Answer  # noqa: E402
from webslm.engine import Engine  # noqa: E402
from webslm.engine.engine import want_for  # noqa: E402
from webslm.request import prompt_ids, sampler_settings  # noqa: E402
from webslm.semantic.json_schema import compile_schema  # noqa: E402
from webslm.semantic.sampler import Sampler  # noqa: E402
from webslm.webgpu.native import NativeGpu  # noqa: E402

PROMPT = [{"role": "system", "content": "Answer in JSON."},
          {"role": "user", "content": "A colour and whether it is primary."}]
SCHEMA = {"type": "object", "properties": {"colour": {"type": "string"}, "primary": {"type": "boolean"},
                                           "shades": {"type": "array", "items": {"type": "string"}}},
          "required": ["colour", "primary"], "additionalProperties": False}


def variants() -> list[tuple[str, dict]]:
    schema = {"response_format": {"type": "json_schema", "json_schema": {"name": "colour", "schema": SCHEMA}}}
    return [("text-greedy", {"temperature": 0}),
            ("text-sampled", {"temperature": 0.8, "top_k": 40, "seed": 1}),
            ("json-object", {"temperature": 0.8, "seed": 1, "response_format": {"type": "json_object"}}),
            ("json-schema-cold", {"temperature": 0.8, "seed": 1, **schema}),
            ("json-schema-warm", {"temperature": 0.8, "seed": 1, **schema})]


async def answer(engine, model, ids, settings) -> dict:
    mask_s = []
    allowed = Answer.allowed

    def timed(self):
        started = time.thread_time()
        try:
            return allowed(self)
        finally:
            mask_s.append(time.thread_time() - started)

    Answer.allowed = timed
    try:
        text = []
        async for delta in engine.generate(list(ids), settings, chat=False):
            text.append(delta.text)
            reason = delta.finish_reason
    finally:
        Answer.allowed = allowed
    t = engine.last_timings
    steps = max(t.generated_tokens - 1, 1)        # decode steps: every token after the first
    return {"tokens": t.generated_tokens, "finish_reason": reason,
            "decode_ms_per_token": round(1000 * t.decode_seconds / steps, 3),
            "mask_cpu_ms_per_token": round(1000 * sum(mask_s) / max(len(mask_s), 1), 3),
            "readback": want_for(Sampler(settings, model.architecture.vocab, history=ids)).kind,
            "text": "".join(text)[:200]}


async def main_async(args) -> dict:
    model = webslm.open_model(args.model)
    engine = Engine(model, gpu=NativeGpu(), policy=AdmissionPolicy(), reuse_kv=False)
    state = await engine.load()
    if engine.backend_kind != "gpu":
        raise SystemExit(f"the GPU was not admitted: {engine.cpu_reason}")
    adapter = (await NativeGpu().request_adapter("core")).summary().description
    ids = prompt_ids(model, PROMPT)
    rows = {}
    try:
        await answer(engine, model, ids, sampler_settings(model, {"temperature": 0, "max_tokens": 4}))  # warm-up
        for name, overrides in variants():
            if name == "json-schema-cold":
                getattr(model.tokenizer, "_schema_masks", {}).clear()      # the masks
                compile_schema.cache_clear()                                 # and the recognizer's steps
            settings = sampler_settings(model, {**overrides, "max_tokens": args.tokens})
            rows[name] = await answer(engine, model, ids, settings)
            print(f"{name:>17}: {rows[name]['tokens']:4d} tokens ({rows[name]['finish_reason']}), decode "
                  f"{rows[name]['decode_ms_per_token']:8.3f} ms/token, mask {rows[name]['mask_cpu_ms_per_token']:7.3f} "
                  f"CPU ms/token, readback {rows[name]['readback']}", flush=True)
    finally:
        await engine.unload()
    return {"model": pathlib.Path(args.model).name, "vocab": model.architecture.vocab, "engine_state": state.name,
            "features": (engine.receipt or {}).get("enabled_feature_bits"),
            "adapter": adapter, "host": platform.platform(), "date": time.strftime("%Y-%m-%d"),
            "tokens": args.tokens, "prompt_tokens": len(ids), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", default=str(ROOT / "bench/results/constrained_decode.json"))
    args = parser.parse_args()
    out = asyncio.run(main_async(args))
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
