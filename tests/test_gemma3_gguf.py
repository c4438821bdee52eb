"""Gemma 3 270M (Q4_K_M GGUF, nobody here wrote it): lossless conversion, and the CPU path
against transformers.

The GGUF comes from `python tools/test_data.py gemma3` (./dev test fetches it); without it
these tests skip. transformers is the oracle: it loads the GGUF itself (dequantized to f32;
it needs `accelerate`) and runs Gemma3ForCausalLM on the CPU in f32.

- `webslm convert` keeps every tensor bit for bit (gguf.quants' f32 values, tensor by tensor);
- the tokenizer (pre-tokenizer "gemma", merges recovered from the vocabulary) encodes and
  decodes like transformers' GGUF-built Gemma tokenizer;
- the CPU path's logits equal transformers' within LOGITS_ATOL on every position of 12 prompts
  and of one prompt past the 512-position sliding window, and its greedy continuations are
  transformers' token for token (a prompt's comparison ends early only where the reference's
  top-2 margin is below MARGIN: a near-tie either side may take; each such case is printed).
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GGUF = ROOT / ".assets" / "cache" / "gemma-3-270m-q4_k_m.gguf"

# f32 CPU forward vs torch f32, |logits| up to ~30. Seen on this machine: 9.5e-05 over the 12
# prompts, 1.8e-3 at 600 positions (rounding differences grow with the context).
LOGITS_ATOL = 1e-3
LONG_LOGITS_ATOL = 1e-2
MARGIN = 0.05             # reference top-2 logit margin under which a greedy step may differ
NEW_TOKENS = 8            # greedy tokens a prompt (CI time: ~1 s a token for both engines)

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, there was a",
    "The chemical symbol for gold is",
    "1, 2, 3, 4, 5,",
    "Water boils at a temperature of",
    "The quick brown fox",
    "In 1969, Neil Armstrong",
    "La capitale de l'Italie est",
    "import numpy as np\n",
    "Photosynthesis is the process by which",
    "日本の首都は",
]
TOKENIZER_TEXTS = PROMPTS + [
    "  two  spaces   three", "tabs\tand\n\nnewlines\n\n\n", " leading space", "trailing space ",
    "naïve café 🙂 ∑ 𝔘", "<start_of_turn>user\nHi<end_of_turn>\n", "<unused5> and <mask>",
    "\u0007 control \u00ad soft hyphen", "www.example.com/path?q=1&r=2", "x" * 300, "",
]


@pytest.fixture(scope="module")
def gemma_gguf() -> Path:
    if not GGUF.is_file():
        pytest.skip(f"{GGUF.name} is not in {GGUF.parent} (python tools/test_data.py gemma3 fetches it)")
    return GGUF


@pytest.fixture(scope="module")
def converted(gemma_gguf, gemma3_270m_slm_path):
    """`webslm convert gemma-3-270m-q4_k_m.gguf -o g.slm`, through the CLI (conftest.py: once
    a session, shared with the GPU's tests of it)."""
    return gemma3_270m_slm_path


@pytest.fixture(scope="module")
def model(converted):
    import webslm
    return webslm.open_model(converted)


@pytest.fixture(scope="module")
def hf_model(gemma_gguf):
    pytest.importorskip("accelerate")            # transformers loads GGUFs only with it
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(gemma_gguf.parent), gguf_file=gemma_gguf.name, dtype=torch.float32)
    return hf.eval()


@pytest.fixture(scope="module")
def hf_tokenizer(gemma_gguf):
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return transformers.AutoTokenizer.from_pretrained(str(gemma_gguf.parent), gguf_file=gemma_gguf.name)


# -- conversion ------------------------------------------------------------------------------

def test_conversion_is_lossless_tensor_by_tensor(gemma_gguf, model):
    reader = gguf.GGUFReader(gemma_gguf)
    assert len(reader.tensors) == len(model.manifest.tensors) == 236
    kinds = {}
    for tensor in reader.tensors:
        name = tensor.name.removesuffix(".weight")
        shape = tuple(int(d) for d in reversed(tensor.shape))
        expected = gguf.quants.dequantize(np.asarray(tensor.data), GT(tensor.tensor_type)).reshape(shape)
        got = model.dequantize(name)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), expected.view(np.uint32)), name
        info = model.manifest.tensors[name]
        kind = (GT(tensor.tensor_type).name, info.encoding, info.quant.zero if info.quant else "none")
        kinds[kind] = kinds.get(kind, 0) + 1
    assert kinds == {("Q5_0", "q5", "offset"): 81, ("Q4_K", "q4k", "scaled-min"): 27, ("Q8_0", "q8", "none"): 10,
                     ("Q6_K", "q6k", "offset"): 9, ("F32", "f32", "none"): 109}


def test_manifest_states_gemma3(model):
    a = dataclasses.asdict(model.architecture)
    assert a == {
        "family": "gemma3", "n_layers": 18, "n_heads": 4, "n_kv_heads": 1, "head_dim": 256,
        "hidden": 640, "ffn": 2048, "vocab": 262144, "context_length": 32768, "norm_eps": 1e-06,
        "tied_output": True, "qkv_bias": False,
        "rope": {"base": 1000000.0, "rotary_dim": 256, "convention": "rotate-half", "position_offset": 0,
                 "scaling": None},
        "gemma3": {"embedding_scale": 640 ** 0.5, "norm_weight_offset": 0.0, "activation": "gelu-tanh",
                   "attention_scale": 0.0625, "sliding_window": 512,
                   "layer_types": ("sliding",) * 5 + ("full",) + ("sliding",) * 5 + ("full",) + ("sliding",) * 5 + ("full",),
                   "local_rope_base": 10000.0}}
    t = model.manifest.tokenizer
    assert (t["byte_level"], t["byte_fallback"], t["pre_tokenizer"]) == (False, True, "gemma")
    assert len(t["tokens"]) == 262144 and len(t["merges"]) == 514906
    assert (t["bos_id"], list(t["eos_ids"]), t["unk_id"], t["pad_id"], t["add_bos"]) == (2, [1, 106], 3, 0, True)
    assert len(t["special_tokens"]) == 6249 and len(t["added_tokens"]) == 165
    assert t["tokens"][138] == "\u2581\u2581"                # stored as two real spaces in the GGUF
    assert any("turn format" in note for note in model.manifest.source["notes"])


def test_the_gpu_admits_it_as_stored(model):
    """Its family and its mix of Q5_0, Q4_K, Q6_K and Q8_0 tensors (a projection stored in two
    types across the layers) are what the GPU step program runs: nothing refuses it before
    the device (tests/test_gpu_gemma3_native.py runs it on the GPU)."""
    from webslm.admission.pipelines import unsupported
    assert unsupported(model.manifest) is None


@pytest.fixture(scope="module")
def hf_greedy(hf_model):
    """transformers' greedy continuation of a prompt (NEW_TOKENS ids, and each step's scores),
    once a prompt: the greedy test and the CLI's test ask it for the same prompt."""
    import torch
    answers = {}

    def greedy(ids: list[int]) -> tuple[list[int], list[np.ndarray]]:
        if tuple(ids) not in answers:
            with torch.no_grad():
                out = hf_model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                        output_scores=True, return_dict_in_generate=True, eos_token_id=None,
                                        pad_token_id=0)
            answers[tuple(ids)] = (out.sequences[0, len(ids):].tolist(), [s[0].float().numpy() for s in out.scores])
        return answers[tuple(ids)]
    return greedy


# -- tokenizer and chat template -----------------------------------------------------------

def test_tokenizer_matches_transformers(model, hf_tokenizer):
    ours = model.tokenizer
    for text in TOKENIZER_TEXTS:
        want = hf_tokenizer.encode(text)
        assert ours.encode(text) == want, text
        assert ours.decode(want) == hf_tokenizer.decode(want), text
        assert ours.decode(want, skip_special=True) == hf_tokenizer.decode(want, skip_special_tokens=True), text


def test_chat_template_renders_gemma_turns(model, hf_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi! "},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a color."}]
    text = model.chat_template.render(messages, add_generation_prompt=True)
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
                    "<start_of_turn>user\nName a color.<end_of_turn>\n<start_of_turn>model\n")
    ids = model.tokenizer.encode(text, add_special=False)
    assert ids == hf_tokenizer.encode(text, add_special_tokens=False)
    assert ids[:3] == [2, 105, 2364] and ids.count(106) == 3


# -- the CPU path against transformers ---------------------------------------------------------

@pytest.fixture(scope="module")
def cpu(model):
    from webslm.cpu import CpuBackend
    return CpuBackend(model)


def reference_logits(hf_model, ids: list[int]) -> np.ndarray:
    import torch
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float().numpy()


def test_cpu_logits_match_transformers(model, cpu, hf_model):
    worst = 0.0
    for prompt in PROMPTS[::2]:          # every other prompt: the greedy test below covers all of them
        ids = model.tokenizer.encode(prompt)
        cpu.reset()
        ours = cpu.prefill(ids, all_logits=True)
        ref = reference_logits(hf_model, ids)
        worst = max(worst, float(np.abs(ours - ref).max()))
        np.testing.assert_allclose(ours, ref, rtol=0, atol=LOGITS_ATOL, err_msg=prompt)
        assert ours[-1].argmax() == ref[-1].argmax()
    print(f"max |logit difference| over {len(PROMPTS[::2])} prompts: {worst:.3g}")


def test_sliding_window_layers_match_past_the_window(model, cpu, hf_model):
    """600 positions: the sliding layers (window 512) must drop the oldest positions as
    transformers does; without the window the last logits differ (so the check has teeth)."""
    text = " ".join(f"Item {i} is {'red' if i % 3 else 'blue'}." for i in range(120))
    ids = model.tokenizer.encode(text)[:600]
    assert len(ids) == 600
    cpu.reset()
    ours = cpu.prefill(ids, all_logits=True)
    ref = reference_logits(hf_model, ids)
    print(f"600 positions: max |logit difference| {np.abs(ours - ref).max():.3g}")
    np.testing.assert_allclose(ours, ref, rtol=0, atol=LONG_LOGITS_ATOL)
    windows = [layer.window for layer in cpu.layers]
    try:
        for layer in cpu.layers:
            layer.window = None
        cpu.reset()
        unwindowed = cpu.prefill(ids)
    finally:
        for layer, window in zip(cpu.layers, windows):
            layer.window = window
        cpu.reset()
    print(f"600 positions without the window: max |logit difference| {np.abs(unwindowed - ref[-1]).max():.3g}")
    assert np.abs(unwindowed - ref[-1]).max() > 100 * LONG_LOGITS_ATOL


def test_cpu_greedy_continuations_equal_transformers(model, cpu, hf_greedy):
    chat = model.chat_template.render([{"role": "user", "content": "What is the capital of Japan?"}],
                                      add_generation_prompt=True)
    prompts = [model.tokenizer.encode(p) for p in PROMPTS] + [model.tokenizer.encode(chat, add_special=False)]
    compared = near_ties = 0
    for ids in prompts:
        want, scores = hf_greedy(ids)
        cpu.reset()
        logits = cpu.prefill(ids)
        for step, token in enumerate(want):
            top2 = np.sort(scores[step])[-2:]
            ours = int(logits.argmax())
            if ours != token and top2[1] - top2[0] < MARGIN:
                near_ties += 1
                print(f"prompt {model.tokenizer.decode(ids)!r}: step {step} a near tie "
                      f"(margin {top2[1] - top2[0]:.3g}): ours {ours}, transformers {token}; stopped there")
                break
            assert ours == token, (model.tokenizer.decode(ids), step, ours, token)
            compared += 1
            logits = cpu.decode_one(token)
    print(f"{compared} greedy tokens equal over {len(prompts)} prompts, {near_ties} near ties")
    assert len(prompts) >= 10 and compared >= (len(prompts) - near_ties) * NEW_TOKENS


def test_cli_generate_greedy_on_the_cpu_equals_transformers(converted, model, hf_greedy, capsys):
    """`webslm generate --model g.slm --greedy --backend cpu`: the whole engine (sampler,
    ledger, stream decoding) gives transformers' greedy ids and text."""
    import json
    from webslm.cli import main
    prompt = PROMPTS[0]
    assert main(["generate", "--model", str(converted), "--prompt", prompt, "--greedy", "--backend", "cpu",
                 "--max-tokens", str(NEW_TOKENS), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    ids = model.tokenizer.encode(prompt)
    want, _ = hf_greedy(ids)
    assert result["prompt_ids"] == ids and result["backend"] == "cpu"
    assert result["token_ids"] == want
    assert result["text"] == model.tokenizer.decode(want, skip_special=True)
