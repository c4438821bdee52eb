"""`webslm generate --greedy` on Gemma 3 270M against transformers' greedy ids, per backend.

    PYTHONPATH=py .venv/bin/python bench/gemma3_greedy.py [--model g.slm] [--backend cpu --backend native]
                                                          [--new-tokens 8] [--prompts 13]

The GGUF (`python tools/test_data.py gemma3`) is converted into a temporary folder unless
--model names a converted one. The oracle is transformers, which loads the same GGUF itself
(dequantized to f32, Gemma3ForCausalLM on the CPU in f32; it needs `accelerate`): its greedy
ids and each step's scores for every prompt. Each (backend, prompt) is one run of the real
command line, `python -m webslm.cli generate --model g.slm --prompt P --greedy --backend B
--max-tokens N --json`, in a fresh process (with --backend native the GPU is forced: the CLI
does not time it against the CPU path).

A prompt agrees when its ids equal the reference's. Where they differ, the first differing
step is reported with the reference's top-2 logit margin there: below MARGIN it is a near tie
(either token may win with another summation order: excused, and stated); otherwise it is a
mismatch. Past a first difference nothing is compared (the continuations condition on
different text). Writes bench/results/gemma3_greedy.json (or --out) and prints a table.
"""
from __future__ import annotations

import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))
GGUF = ROOT / ".assets" / "cache" / "gemma-3-270m-q4_k_m.gguf"
MARGIN = 0.05             # reference top-2 logit margin under which a greedy step may differ

# (prompt, wrapped in the chat template?): plain text for the base model, code, digits, two
# other languages, and one chat turn (Gemma's <start_of_turn> markup).
PROMPTS = [
    ("The capital of France is", False),
    ("def fibonacci(n):", False),
    ("Once upon a time, there was a", False),
    ("The chemical symbol for gold is", False),
    ("1, 2, 3, 4, 5,", False),
    ("Water boils at a temperature of", False),
    ("The quick brown fox", False),
    ("In 1969, Neil Armstrong", False),
    ("La capitale de l'Italie est", False),
    ("import numpy as np\n", False),
    ("Photosynthesis is the process by which", False),
    ("日本の首都は", False),
    ("What is the capital of Japan?", True),
]


def load_reference(gguf: pathlib.Path):
    """transformers' Gemma3ForCausalLM from the GGUF, f32, on the CPU."""
    import torch
    import transformers
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                              dtype=torch.float32)
    return model.eval()


def reference_greedy(hf_model, ids: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
    """transformers' greedy ids after `ids` (no stop token: exactly new_tokens) and the top-2
    logit margin at each step."""
    import torch
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                                output_scores=True, return_dict_in_generate=True, eos_token_id=None,
                                pad_token_id=0)
    margins = []
    for scores in out.scores:
        top2 = np.sort(scores[0].float().numpy())[-2:]
        margins.append(float(top2[1] - top2[0]))
    return out.sequences[0, len(ids):].tolist(), margins


def compare(ours: list[int], want: list[int], margins: list[float], eos_ids=frozenset()) -> dict:
    """Token-by-token comparison with the near-tie rule: verdict "equal", "near-tie" (the
    first difference is where the reference's margin < MARGIN) or "mismatch". The engine does
    not commit the EOS that ends an answer (webslm/answer.py): an answer shorter than the
    reference's is equal when the reference's next token is an EOS (the reference runs on past
    it: eos_token_id=None)."""
    for step, (a, b) in enumerate(zip(ours, want)):
        if a != b:
            verdict = "near-tie" if margins[step] < MARGIN else "mismatch"
            return {"verdict": verdict, "equal_tokens": step, "first_difference": step,
                    "ours": a, "reference": b, "margin": margins[step]}
    if len(ours) < len(want) and want[len(ours)] in eos_ids:
        return {"verdict": "equal", "equal_tokens": len(ours), "stopped_at_eos": want[len(ours)]}
    if len(ours) != len(want):          # an early stop on one side only
        return {"verdict": "mismatch", "equal_tokens": min(len(ours), len(want)), "first_difference": None,
                "length": [len(ours), len(want)]}
    return {"verdict": "equal", "equal_tokens": len(want)}


def cli_generate(model: pathlib.Path, prompt: str, chat: bool, backend: str, new_tokens: int) -> dict:
    """One `webslm generate ... --greedy --json` in a fresh process; its JSON answer."""
    cmd = [sys.executable, "-m", "webslm.cli", "generate", "--model", str(model), "--prompt", prompt,
           "--greedy", "--backend", backend, "--max-tokens", str(new_tokens), "--json"]
    if chat:
        cmd.append("--chat")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "py")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"webslm generate exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def run(model: pathlib.Path, backends: list[str], new_tokens: int, prompts: list[tuple[str, bool]]) -> dict:
    import webslm
    eos_ids = frozenset(webslm.open_model(model).manifest.tokenizer["eos_ids"])
    hf_model = load_reference(GGUF)
    rows = []
    for prompt, chat in prompts:
        first = None
        for backend in backends:
            started = time.perf_counter()
            answer = cli_generate(model, prompt, chat, backend, new_tokens)
            seconds = time.perf_counter() - started
            if first is None:   # the reference continues the prompt ids the command line used
                first = reference_greedy(hf_model, answer["prompt_ids"], new_tokens)
            want, margins = first
            result = compare(answer["token_ids"], want, margins, eos_ids)
            rows.append({"prompt": prompt, "chat": chat, "backend": backend, "answered_on": answer["backend"],
                         "prompt_ids": answer["prompt_ids"], "ids": answer["token_ids"], "reference_ids": want,
                         "reference_margins": [round(m, 4) for m in margins], "text": answer["text"],
                         "finish_reason": answer["finish_reason"], "seconds": round(seconds, 1), **result})
            print(f"{backend:6s} {result['verdict']:8s} {result['equal_tokens']}/{len(want)} "
                  f"{seconds:6.1f} s  {prompt!r} -> {answer['text']!r}", flush=True)
    return {"rows": rows, "summary": summarize(rows, backends)}


def summarize(rows: list[dict], backends: list[str]) -> dict:
    summary = {}
    for backend in backends:
        mine = [r for r in rows if r["backend"] == backend]
        summary[backend] = {
            "prompts": len(mine),
            "equal": sum(r["verdict"] == "equal" for r in mine),
            "near_tie": sum(r["verdict"] == "near-tie" for r in mine),
            "mismatch": sum(r["verdict"] == "mismatch" for r in mine),
            "answered_on": sorted({r["answered_on"] for r in mine}),
            "tokens_compared_equal": sum(r["equal_tokens"] for r in mine),
        }
    return summary


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=pathlib.Path, default=None, help="a converted g.slm (default: convert the GGUF)")
    p.add_argument("--backend", action="append", choices=["cpu", "native"], default=None)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help="the first N prompts")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "gemma3_greedy.json")
    args = p.parse_args(argv)
    if not GGUF.is_file():
        print(f"gemma3_greedy: {GGUF} is missing (python tools/test_data.py gemma3 fetches it)", file=sys.stderr)
        return 2
    backends = args.backend or ["cpu", "native"]
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            model = pathlib.Path(tmp) / "g.slm"
            subprocess.run([sys.executable, "-m", "webslm.cli", "convert", str(GGUF), "-o", str(model)], check=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "py")}, capture_output=True)
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        result = run(model, backends, args.new_tokens, PROMPTS[:args.prompts])
    result = {"bench": "gemma3_greedy", "started": started, "model": GGUF.name, "new_tokens": args.new_tokens,
              "margin": MARGIN, "machine": f"{platform.node()} ({os.cpu_count()} cores, shared)",
              "oracle": "transformers Gemma3ForCausalLM from the GGUF, f32, CPU", **result}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    return 0 if all(s["mismatch"] == 0 for s in result["summary"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
