"""Time to first token over the turns of one conversation, with and without KV-cache reuse
(py/webslm/engine/prompt_cache.py), natively: the CPU path (numpy) or the GPU (wgpu-native).

    PYTHONPATH=py python bench/turns.py [--backend cpu|native] [--turns 5] [--max-tokens 48]
                                        [--model FILE.slm] [--out bench/results/turns_cpu.json]

Each variant is a fresh Engine that answers the same five questions in one conversation, the
way the chat page sends them: every turn the whole conversation (the model's default system
prompt, every question and every answer so far, the new question) is chat-templated and
tokenized, and the engine answers it greedily. "reuse" keeps what the KV cache shares with
the new prompt and prefills the rest; "fresh" (Engine(reuse_kv=False)) prefills everything.
Time to first token is measured from the request to the first text delta. Greedy answers must
come out the same in both variants (tokens, listed per turn); where they do not, the record
says at which turn. The JSON keeps every turn: prompt tokens, tokens kept, prefill seconds,
time to first token, decode tokens/s and the answer.
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
from webslm.engine import Engine  # noqa: E402
from webslm.semantic.sampler import SamplerSettings  # noqa: E402

DEFAULT_MODEL = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"
QUESTIONS = [
    "What is the capital of France?",
    "Tell me three facts about its history.",
    "Which river flows through it?",
    "Name two famous museums there.",
    "Summarize our conversation in one sentence.",
]


async def conversation(model, backend: str, reuse: bool, turns: int, max_tokens: int) -> dict:
    gpu = None
    if backend == "native":
        from webslm.webgpu.native import NativeGpu
        gpu = NativeGpu()
    engine = Engine(model, gpu=gpu, reuse_kv=reuse)
    loaded = time.perf_counter()
    await engine.load()
    load_s = time.perf_counter() - loaded
    settings = SamplerSettings(temperature=0.0, max_tokens=max_tokens)
    messages, rows = [], []
    try:
        for turn in range(turns):
            messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
            text = model.chat_template.render(messages, add_generation_prompt=True)
            ids = model.tokenizer.encode(text, add_special=False)
            started = time.perf_counter()
            first, pieces = None, []
            async for delta in engine.generate(ids, settings, chat=False):
                if delta.text and first is None:
                    first = time.perf_counter() - started
                pieces.append(delta.text)
            t = engine.last_timings
            answer = "".join(pieces)
            messages.append({"role": "assistant", "content": answer})
            rows.append({"turn": turn + 1, "prompt_tokens": t.prompt_tokens, "cached_tokens": t.cached_tokens,
                         "prefill_s": round(t.prefill_seconds, 3),
                         "time_to_first_token_s": round(first, 3) if first is not None else None,
                         "completion_tokens": t.generated_tokens,
                         "decode_tokens_per_s": round(t.generated_tokens / max(t.decode_seconds, 1e-9), 2),
                         "answer": answer, "token_ids": list(engine.ledger.committed_ids)})
        return {"reuse": reuse, "backend": engine.backend_kind, "load_s": round(load_s, 2), "turns": rows}
    finally:
        await engine.unload()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=pathlib.Path, default=DEFAULT_MODEL)
    ap.add_argument("--backend", choices=("cpu", "native"), default="cpu")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args(argv)
    model = webslm.open_model(args.model)
    variants = [asyncio.run(conversation(model, args.backend, reuse, args.turns, args.max_tokens))
                for reuse in (True, False)]
    reuse, fresh = variants
    differ = [a["turn"] for a, b in zip(reuse["turns"], fresh["turns"]) if a["token_ids"] != b["token_ids"]]
    record = {"bench": "turns", "model": args.model.name, "backend": args.backend, "max_tokens": args.max_tokens,
              "machine": platform.platform(), "python": platform.python_version(),
              "answers_differ_at_turns": differ, "variants": variants}
    print("turn  prompt  kept  first token reuse / fresh (s)  prefill reuse / fresh (s)")
    for a, b in zip(reuse["turns"], fresh["turns"]):
        print(f"{a['turn']:>4}  {a['prompt_tokens']:>6}  {a['cached_tokens']:>4}  "
              f"{a['time_to_first_token_s']:>8} / {b['time_to_first_token_s']:<8}        "
              f"{a['prefill_s']:>7} / {b['prefill_s']}")
    print("answers differ at turns:", differ or "none")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
