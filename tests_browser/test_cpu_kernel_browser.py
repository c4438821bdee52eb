"""The worker's CPU path runs its products in the Wasm kernel (worker/qmatmul.mjs on
Pyodide's memory, py/webslm/cpu/qmatmul.c) and answers exactly what CPython's CPU path
answers (the native build of the same source: the same f32 operations in the same order).

    .venv/bin/python -m pytest tests_browser/test_cpu_kernel_browser.py -k chromium -x -q
"""
from __future__ import annotations

import json
import pathlib

import pytest
from conftest import GREEDY_MAX_TOKENS, GREEDY_PROMPT

ROOT = pathlib.Path(__file__).resolve().parents[1]
GREEDY = {"temperature": 0, "max_tokens": GREEDY_MAX_TOKENS}


def test_the_cpu_path_runs_the_wasm_kernel_and_answers_as_cpython(booted, cpu_reference):
    manifest = json.loads((ROOT / ".assets/site/manifest.json").read_text())
    if "kernels" not in manifest:
        pytest.skip("the site was built without clang: no Wasm kernel (tools/build_kernels.py)")
    status = booted.request("status")
    assert status["cpu_kernel_load"] == {"kernel": "wasm simd128"}, status
    assert status["cpu_kernel"].startswith("wasm simd128"), status

    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
    if booted.request("engine-status")["backend"] != "cpu":
        booted.request("use-cpu", timeout_s=600)
    engine = booted.request("engine-status")
    assert engine["backend"] == "cpu", engine

    answer = booted.row.eval(f"(window.webslm.newChat(), window.webslm.ask({json.dumps(GREEDY_PROMPT)}, "
                             f"{json.dumps(GREEDY)}))", timeout_s=900)
    assert answer["backends"] == ["cpu"], answer
    assert answer["token_ids"] == cpu_reference["token_ids"], (answer["text"], cpu_reference)
    assert answer["text"] == cpu_reference["text"] and "Paris" in answer["text"]
    timings = answer["timings"]
    booted.results.setdefault("cpu_kernel", {}).update(
        kernel=status["cpu_kernel"], decode_tokens_per_s=timings["decode_tokens_per_s"],
        prompt_tokens=answer["usage"]["prompt_tokens"], prefill_seconds=timings["prefill_seconds"])
    booted.record()
    print(f"\n{booted.row.name}: {status['cpu_kernel']}: {answer['text']!r}, "
          f"decode {timings['decode_tokens_per_s']} tok/s")
