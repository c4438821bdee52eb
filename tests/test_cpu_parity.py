"""The CPU engine (webslm.cpu) on the default model against Hugging Face transformers.

Oracle: transformers' LlamaForCausalLM in float32, loaded from the GGUF the default .slm was
converted from (.assets/cache/SmolLM2-135M-Instruct.Q4_1.gguf; transformers dequantizes it
to float and un-permutes Q/K itself). The .slm is a lossless repack of that file, so both
engines hold the same weight values and differ only in f32 arithmetic order. Loaded once
per module. The prompts are rendered with our chat template and encoded with our
tokenizer (both have their own oracle tests); the same ids go to both engines.

Measured (x86-64, numpy on OpenBLAS, torch 2.13 CPU, transformers 5.24; the worst of runs
with 1 and 2 BLAS threads), and the bounds asserted; logits here are O(10-30):

    check                                                   measured max        bound
    last-position logits |ours - HF|, 12 prompts (1-256 t.) 7.5e-5              3e-4
    any position, prompts and prompt + greedy answer        1.9e-4              3e-4
    top-1 at every prompt position                          same                same
    greedy continuations on 10 prompts (7 to 64 tokens),
      our decode_one loop vs HF generate() + its KV cache   identical           identical
    teacher forcing on those 10 greedy answers:
      per-position top-1 agreement                          100 %               100 %
      oracle's smallest top1-top2 margin on the answers     0.003 (reported)    -
    rebuild(committed) vs the uninterrupted decode          8.0e-5              3e-4
    decode_one after prefill vs one prefill of everything   1.0e-4              3e-4

The last two are the engine against itself: the same f32 products summed in another order
(BLAS gemm for T rows vs gemv for one), hence no tighter than against HF; bit-identity is not
required. A real defect is far outside these bounds: norm_eps x10 moves the logits by 0.1,
the attention scale x1.002 by 0.06.

`pytest tests/test_cpu_parity.py -s` prints every measured value. The whole file takes
~50-55 s on 2 cores, idle or with one busy elsewhere (20-25 s of it transformers
dequantizing the GGUF).
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

import webslm
from webslm.cpu.backend import CpuBackend

ROOT = pathlib.Path(__file__).resolve().parents[1]
SLM = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"
GGUF = ROOT / ".assets/cache/SmolLM2-135M-Instruct.Q4_1.gguf"

HF_TOL = 3e-4          # max |ours - HF| of any logit
SELF_TOL = 3e-4        # the engine against itself: rebuild / decode_one vs prefill (f32 order only)
GREEDY_TOKENS = 64

LONG = (
    "Summarize the following text in two sentences.\n\n"
    "The history of the bicycle begins in the early nineteenth century, when Karl Drais built a "
    "two-wheeled running machine in Mannheim in 1817. Riders pushed it along with their feet. "
    "In the 1860s, French makers added pedals to the front wheel, producing the velocipede, which "
    "was heavy and uncomfortable on cobbled streets and earned the nickname 'boneshaker'. The high "
    "wheeler of the 1870s enlarged the front wheel to travel further with each turn of the pedals, "
    "but it was dangerous: a sudden stop could throw the rider over the handlebars. The safety "
    "bicycle of the 1880s, with two wheels of equal size and a chain driving the rear wheel, solved "
    "this problem. Together with the pneumatic tyre, invented by John Boyd Dunlop in 1888, it made "
    "cycling popular across Europe and North America, gave many women new independence, and led to "
    "better roads, which the first automobiles would soon use as well."
)

# (label, messages or None for raw text, raw text)
PROMPTS = [
    ("factual", [{"role": "user", "content": "What is the capital of France?"}], None),
    ("code", [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}], None),
    ("math", [{"role": "user", "content": "What is 17 * 23? Show your work step by step."}], None),
    ("french", [{"role": "user", "content": "Quelle est la capitale de l'Allemagne ? Réponds en français."}], None),
    ("japanese", [{"role": "user", "content": "東京について一文で説明してください。"}], None),
    ("emoji+german", [{"role": "user", "content": "Übersetze bitte: 'good morning' 🙂 – und 'thank you'!"}], None),
    ("code-explain", [{"role": "user",
                       "content": "def f(xs):\n    return [x**2 for x in xs if x % 2]\n\nWhat does f do?"}], None),
    ("system+multi-turn", [{"role": "system", "content": "You answer in one short sentence."},
                           {"role": "user", "content": "Name a primary colour."},
                           {"role": "assistant", "content": "Red is a primary colour."},
                           {"role": "user", "content": "Name another one."}], None),
    ("long", [{"role": "user", "content": LONG}], None),
    ("raw text", None, "Once upon a time, in a small village by the sea,"),
    ("raw digits+spaces", None, "  3.14159 26535   89793\t\n"),
    ("single token", None, "Hello"),
]
# our decode_one loop, 64 tokens or EOS, on ten varied prompts ...
GREEDY = ["factual", "code", "math", "french", "japanese", "emoji+german", "code-explain",
          "system+multi-turn", "long", "raw text"]
HF_GENERATE = GREEDY                       # ... each compared with HF's generate() and its KV cache


# -- setup -----------------------------------------------------------------------------------------

def _load_oracle(torch):
    """transformers' model from the GGUF, float32. from_pretrained(gguf_file=...) needs
    `accelerate`; without it, the same steps by hand (config and tensors from the GGUF through
    transformers' own GGUF reader, which dequantizes and reverses llama.cpp's Q/K permutation)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import is_accelerate_available
    if is_accelerate_available():
        return AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name, dtype=torch.float32)
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    config = AutoConfig.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    with torch.device("meta"):      # no random init: every parameter is assigned below
        hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(GGUF), return_tensors=True, model_to_load=hf)["tensors"]
    result = hf.load_state_dict({k: v.to(torch.float32) for k, v in tensors.items()}, strict=False, assign=True)
    hf.tie_weights()
    assert not result.unexpected_keys and set(result.missing_keys) <= {"lm_head.weight"}, result
    # the rotary buffers are not in the checkpoint: rebuild them off the meta device
    hf.model.rotary_emb = type(hf.model.rotary_emb)(config=hf.config)
    for name, tensor in [*hf.named_parameters(), *hf.named_buffers()]:
        assert tensor.device.type == "cpu", f"{name} was not loaded"
    return hf


def _openblas_threads(n: int | None) -> int | None:
    """Set numpy's bundled OpenBLAS to n threads (None: only read); the previous count, or
    None where the library or its functions are not found (other BLAS builds: left alone)."""
    import ctypes
    libs = pathlib.Path(np.__file__).parent.with_name("numpy.libs")
    for path in sorted(libs.glob("*openblas*.so*")) if libs.is_dir() else []:
        lib = ctypes.CDLL(str(path))
        for suffix in ("64_", "_64_", ""):
            get = getattr(lib, f"scipy_openblas_get_num_threads{suffix}", None) or getattr(lib, "openblas_get_num_threads", None)
            put = getattr(lib, f"scipy_openblas_set_num_threads{suffix}", None) or getattr(lib, "openblas_set_num_threads", None)
            if get and put:
                before = int(get())
                if n is not None:
                    put(ctypes.c_int(n))
                return before
    return None


@pytest.fixture(scope="module")
def env():
    """One thread for numpy's BLAS and for torch while this module runs: with 2 cores and any
    other load, their spinning thread pools slowed it 15-30x (measured: 13 s -> 193 s for the
    prompt comparisons with one core busy elsewhere); one thread changes no result here."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")        # before transformers is imported: it reads it then
        blas = _openblas_threads(1)
        torch = pytest.importorskip("torch", reason="torch is the oracle's runtime (test extra)")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield _env()
        finally:
            torch.set_num_threads(threads)
            if blas is not None:
                _openblas_threads(blas)


def _env() -> dict:
    torch = pytest.importorskip("torch", reason="torch is the oracle's runtime (test extra)")
    pytest.importorskip("transformers", reason="transformers is the oracle (test extra)")
    pytest.importorskip("gguf", reason="transformers reads GGUF through the gguf package")
    if not SLM.is_file():
        pytest.skip(f"default model not built: {SLM.relative_to(ROOT)} (run `python tools/assets.py`)")
    if not GGUF.is_file():
        pytest.skip(f"source GGUF not cached: {GGUF.relative_to(ROOT)} (set-up downloads it)")
    started = time.perf_counter()
    hf = _load_oracle(torch).eval()
    loaded = time.perf_counter()
    model = webslm.open_model(SLM)
    backend = CpuBackend(model)
    print(f"\noracle loaded in {loaded - started:.1f} s; ours in {time.perf_counter() - loaded:.1f} s")
    return {"torch": torch, "hf": hf, "model": model, "backend": backend, "eos": model.manifest.tokenizer["eos_ids"]}


def prompt_ids(model, messages, raw) -> list[int]:
    if messages is None:
        return model.tokenizer.encode(raw, add_special=False)
    text = model.chat_template.render(messages, add_generation_prompt=True)
    return model.tokenizer.encode(text, add_special=False)


def hf_logits(env, ids) -> np.ndarray:
    """HF's logits at every position of ids (one forward, no cache), float32 [T, V]."""
    torch = env["torch"]
    with torch.no_grad():
        return env["hf"](torch.tensor([ids]), use_cache=False).logits[0].float().numpy()


def our_greedy(env, ids) -> tuple[list[int], list[np.ndarray]]:
    """Argmax loop with decode_one: (tokens, EOS included if reached; logits before each)."""
    backend = env["backend"]
    backend.reset()
    logits, tokens, seen = backend.prefill(ids), [], []
    for _ in range(GREEDY_TOKENS):
        seen.append(logits)
        tokens.append(int(np.argmax(logits)))
        if tokens[-1] in env["eos"] or len(tokens) == GREEDY_TOKENS:
            break
        logits = backend.decode_one(tokens[-1])
    return tokens, seen


@pytest.fixture(scope="module")
def prompts(env):
    out = {label: prompt_ids(env["model"], messages, raw) for label, messages, raw in PROMPTS}
    assert len(out["single token"]) == 1
    assert len(out["long"]) >= 200
    return out


@pytest.fixture(scope="module")
def greedy(env, prompts):
    """label -> (tokens, our logits before each token), computed once."""
    out = {}
    for label in GREEDY:
        started = time.perf_counter()
        out[label] = our_greedy(env, prompts[label])
        print(f"\nour greedy '{label}': {len(out[label][0])} tokens in {time.perf_counter() - started:.1f} s: "
              f"{env['model'].tokenizer.decode(out[label][0])!r}")
    return out


# -- the tests -------------------------------------------------------------------------------------

def test_prompt_logits_match_transformers(env, prompts):
    """Every position of every prompt (one prefill with all_logits), the last one above all."""
    backend = env["backend"]
    worst_last = worst_all = 0.0
    print()
    for label, ids in prompts.items():
        backend.reset()
        ours = backend.prefill(ids, all_logits=True)
        ref = hf_logits(env, ids)
        assert ours.shape == ref.shape == (len(ids), env["model"].architecture.vocab)
        last, every = float(np.abs(ours[-1] - ref[-1]).max()), float(np.abs(ours - ref).max())
        worst_last, worst_all = max(worst_last, last), max(worst_all, every)
        print(f"  {label:18} {len(ids):4} tokens: last-position max |diff| {last:.2e}, all positions {every:.2e}, "
              f"top-1 {'same' if ours[-1].argmax() == ref[-1].argmax() else 'DIFFERENT'}")
        assert last < HF_TOL, f"{label}: last-position logits differ by {last:.2e}"
        assert every < HF_TOL, f"{label}: logits differ by {every:.2e}"
        assert np.array_equal(ours.argmax(-1), ref.argmax(-1)), label
        backend.reset()
        np.testing.assert_allclose(backend.prefill(ids), ours[-1], rtol=0, atol=SELF_TOL)
    print(f"  worst: last position {worst_last:.2e}, any position {worst_all:.2e} (bound {HF_TOL:.0e})")


def test_greedy_continuations_match_transformers_generate(env, prompts, greedy):
    torch = env["torch"]
    for label in HF_GENERATE:
        ids, (ours, _) = prompts[label], greedy[label]
        started = time.perf_counter()
        with torch.no_grad():
            out = env["hf"].generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     do_sample=False, max_new_tokens=GREEDY_TOKENS, eos_token_id=env["eos"],
                                     pad_token_id=env["eos"][0], temperature=None, top_p=None, top_k=None)
        theirs = out[0, len(ids):].tolist()
        print(f"\nHF generate '{label}': {len(theirs)} tokens in {time.perf_counter() - started:.1f} s")
        first = next((i for i, (a, b) in enumerate(zip(theirs + [-1], ours + [-2])) if a != b), None)
        assert theirs == ours, f"{label}: the continuations differ from token {first} on"
    assert greedy["factual"][0][-1] in env["eos"]                  # a stop at EOS, compared as such
    assert len(greedy["code"][0]) == GREEDY_TOKENS                 # and a full-length run


def test_teacher_forcing_top1_agreement(env, prompts, greedy):
    """Feed prompt + our greedy answer through both at once: at every answer position HF's
    top-1 is the token we chose, so HF's own greedy loop (without a cache) would produce it."""
    backend = env["backend"]
    print()
    for label in GREEDY:
        ids, (tokens, _) = prompts[label], greedy[label]
        seq = ids + tokens
        backend.reset()
        ours = backend.prefill(seq, all_logits=True)
        ref = hf_logits(env, seq)
        answer = slice(len(ids) - 1, len(seq) - 1)           # the logits that chose each answer token
        ours_top1, ref_top1 = ours.argmax(-1), ref.argmax(-1)
        agreement = float(np.mean(ours_top1 == ref_top1))
        top2 = np.sort(ref[answer], axis=-1)[:, -2:]
        margin = float(np.min(top2[:, 1] - top2[:, 0]))
        diff = float(np.abs(ours - ref).max())
        print(f"  {label:8} {len(seq)} positions: top-1 agreement {100 * agreement:.1f} %, max |diff| {diff:.2e}, "
              f"oracle's smallest top1-top2 margin on the answer {margin:.3g}")
        assert agreement == 1.0, f"{label}: top-1 differs at positions {np.nonzero(ours_top1 != ref_top1)[0].tolist()}"
        assert ref_top1[answer].tolist() == tokens, label
        assert diff < HF_TOL, label


def test_decode_one_after_prefill_equals_prefill_of_everything(env, prompts, greedy):
    """Each decode_one step's logits (recorded in the greedy loop) against one prefill of the
    whole sequence with all_logits, position by position."""
    backend = env["backend"]
    worst = 0.0
    for label in GREEDY:
        ids, (tokens, seen) = prompts[label], greedy[label]
        backend.reset()
        full = backend.prefill(ids + tokens, all_logits=True)
        for step, logits in enumerate(seen):
            diff = float(np.abs(logits - full[len(ids) - 1 + step]).max())
            worst = max(worst, diff)
            assert diff < SELF_TOL, f"{label} step {step}: {diff:.2e}"
    print(f"\ndecode_one vs whole-sequence prefill: max |diff| {worst:.2e} (bound {SELF_TOL:.0e})")


def test_rebuild_continues_like_the_uninterrupted_decode(env, prompts, greedy):
    """After a device loss the engine rebuilds from the committed ids: the next logits and the
    decode that follows are those of the run that was never interrupted."""
    backend = env["backend"]
    ids, (tokens, seen) = prompts["code"], greedy["code"]
    worst = 0.0
    for k in (1, 17, 40):
        backend.reset()
        backend.prefill(ids[:5])                              # some other state to be discarded
        logits = backend.rebuild(ids + tokens[:k])
        assert backend.position == len(ids) + k
        for step in range(k, k + 4):
            diff = float(np.abs(logits - seen[step]).max())
            worst = max(worst, diff)
            assert diff < SELF_TOL, f"rebuild at {k}, step {step}: {diff:.2e}"
            assert int(np.argmax(logits)) == tokens[step]
            logits = backend.decode_one(tokens[step])
    print(f"\nrebuild vs uninterrupted decode: max |diff| {worst:.2e} (bound {SELF_TOL:.0e})")


def test_cli_generate_answers_paris(env):
    """The installed `webslm` command (python -m webslm.cli where no script is installed)."""
    script = pathlib.Path(sys.executable).with_name("webslm")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "webslm.cli"]
    started = time.perf_counter()
    result = subprocess.run(
        command + ["generate", "--model", str(SLM), "--prompt",
         "What is the capital of France?", "--chat", "--greedy", "--max-tokens", "32"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})   # see env()
    print(f"\nwebslm generate ({time.perf_counter() - started:.1f} s): {result.stdout!r}")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
