"""Family "gemma3" on a tiny random model: the CPU path against transformers'
Gemma3ForCausalLM, the "gemma" tokenizer against HF `tokenizers`, and the malformed corpus
for every field the family and the pre-tokenizer add.

The model is transformers' own random init (norm weights randomized too: Gemma's (1 + w)
would hide a missing offset at w = 0), written as f32 with norm_weight_offset 1 (Hugging Face's
convention; the GGUF path with offset 0 is tests/test_gemma3_gguf.py). Its shape exercises what
the real 270M does not at small sizes: a sliding window of 8 inside 24-position prompts, GQA
4/2, an attention scale that is not 1/sqrt(head_dim), hidden != n_heads * head_dim.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

import gemma3_model
import slm_surgery as surgery
from gemma3_model import (ADDED, ARCHITECTURE, LAYER_TYPES, QUERY_PRE_ATTN_SCALAR, SPECIALS, TOKENS,
                          tokenizer_section)
from webslm.artifact import ArtifactError, Validator, validate_bytes
from webslm.artifact import format as fmt
from webslm.artifact.errors import CODES
from webslm.convert.gguf_tokenizer import merges_from_vocabulary
from webslm.semantic.tokenizer import Tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL = 2e-5               # f32 numpy vs f32 torch on this model (|logits| ~ 3)


@pytest.fixture(scope="module")
def hf_model():
    a, g = ARCHITECTURE, ARCHITECTURE["gemma3"]
    config = transformers.Gemma3TextConfig(
        vocab_size=a["vocab"], hidden_size=a["hidden"], intermediate_size=a["ffn"],
        num_hidden_layers=a["n_layers"], num_attention_heads=a["n_heads"], num_key_value_heads=a["n_kv_heads"],
        head_dim=a["head_dim"], sliding_window=g["sliding_window"], query_pre_attn_scalar=QUERY_PRE_ATTN_SCALAR,
        max_position_embeddings=a["context_length"], rms_norm_eps=a["norm_eps"],
        layer_types=[f"{t}_attention" for t in LAYER_TYPES],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": a["rope"]["base"]},
                         "sliding_attention": {"rope_type": "default", "rope_theta": g["local_rope_base"]}},
        attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.5)          # (1 + w) with w != 0
            else:
                p.normal_(0.0, 0.2)
    return model


HF_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
            "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
            "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "post_attention_norm",
            "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
            "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


@pytest.fixture(scope="module")
def tiny_slm(hf_model, tmp_path_factory) -> bytes:
    state = {k: v.detach().numpy().astype(np.float32) for k, v in hf_model.state_dict().items()}
    ours = {"token_embd": state["model.embed_tokens.weight"], "output_norm": state["model.norm.weight"]}
    for i in range(ARCHITECTURE["n_layers"]):
        for hf, name in HF_NAMES.items():
            ours[f"blk.{i}.{name}"] = state[f"model.layers.{i}.{hf}.weight"]
    path = tmp_path_factory.mktemp("tiny_gemma3") / "g.slm"
    gemma3_model.write(path, ours)
    return path.read_bytes()


def hf_logits(hf_model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].numpy()


def test_cpu_prefill_and_decode_match_transformers(tiny_slm, hf_model):
    from webslm.cpu import CpuBackend
    cpu = CpuBackend(validate_bytes(tiny_slm))
    rng = np.random.default_rng(4)
    for length in (5, 24):                                   # 24 > the window of 8
        ids = rng.integers(0, ARCHITECTURE["vocab"], length).tolist()
        ref = hf_logits(hf_model, ids)
        cpu.reset()
        np.testing.assert_allclose(cpu.prefill(ids, all_logits=True), ref, rtol=0, atol=ATOL)
        cpu.reset()
        cpu.prefill(ids[:3])
        for position in range(3, length):                   # one token at a time through the window
            np.testing.assert_allclose(cpu.decode_one(ids[position]), ref[position], rtol=0, atol=ATOL)


def test_every_gemma3_difference_matters(tiny_slm, hf_model):
    """Each stated fact changes the logits: dropping any one of them breaks the match."""
    import dataclasses
    from webslm.cpu import CpuBackend
    from webslm.cpu import layers
    model = validate_bytes(tiny_slm)
    ids = np.random.default_rng(5).integers(0, 300, 24).tolist()
    ref = hf_logits(hf_model, ids)

    def differs(cpu) -> bool:
        return np.abs(cpu.prefill(ids, all_logits=True) - ref).max() > 100 * ATOL

    cpu = CpuBackend(model)
    cpu.embedding_scale = None
    assert differs(cpu)
    cpu = CpuBackend(model)
    cpu.attention_scale = None
    assert differs(cpu)
    cpu = CpuBackend(model)
    cpu.ffn = layers.swiglu
    assert differs(cpu)
    cpu = CpuBackend(model)
    for layer in cpu.layers:
        layer.window = None
    assert differs(cpu)
    cpu = CpuBackend(model)
    for layer in cpu.layers:
        layer.post_ffw_norm = None
    assert differs(cpu)
    no_offset = dataclasses.replace(model.architecture.gemma3, norm_weight_offset=0.0)

    class WithoutOffset:
        architecture = dataclasses.replace(model.architecture, gemma3=no_offset)

        def __getattr__(self, name):                 # the tensors: the model's own
            return getattr(model, name)
    assert differs(CpuBackend(WithoutOffset()))


# -- the "gemma" tokenizer -------------------------------------------------------------------

def hf_gemma_style_tokenizer():
    """HF `tokenizers` set up as transformers' GemmaTokenizer is, over TOKENS."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import AddedToken, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    merges = [tuple(m.split(" ")) for m in merges_from_vocabulary(TOKENS)]
    tok = tokenizers.Tokenizer(BPE(vocab={t: i for i, t in enumerate(TOKENS)}, merges=merges, fuse_unk=True,
                                   unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIALS])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in ADDED])
    return tok


def test_gemma_tokenizer_matches_hf_tokenizers_on_random_text():
    ours = Tokenizer.from_manifest(tokenizer_section())
    hf = hf_gemma_style_tokenizer()
    alphabet = ["a", "b", "c", " ", "  ", "\n", "\n\n", "\t", "é", "🙂", "<start_of_turn>", "<eos>", "x"]
    rnd = random.Random(9)
    for _ in range(400):
        text = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 12)))
        want = hf.encode(text, add_special_tokens=False).ids
        assert ours.encode(text, add_special=False) == want, repr(text)
        assert ours.decode(want) == hf.decode(want, skip_special_tokens=False), repr(text)
        assert ours.decode(want, skip_special=True) == hf.decode(want, skip_special_tokens=True), repr(text)


def test_gemma_tokenizer_prepends_nothing_and_keeps_added_tokens_as_text():
    t = Tokenizer.from_manifest(tokenizer_section())
    assert t.encode("ab", add_special=False) == [TOKENS.index("ab")]
    assert t.encode(" ab", add_special=False) == [TOKENS.index("\u2581ab")]
    assert t.encode("ab") == [2, TOKENS.index("ab")]                       # add_bos
    ids = t.encode("a\n\nb<end_of_turn>", add_special=False)
    assert ids == [TOKENS.index("a"), TOKENS.index("\n\n"), TOKENS.index("b"), 5]
    assert t.decode(ids, skip_special=True) == "a\n\nb"
    assert t.decode(t.encode(" ab", add_special=False)) == " ab"            # no leading space stripped


# -- the malformed corpus for the new fields ---------------------------------------------------

def expect(code: str, data: bytes) -> ArtifactError:
    with pytest.raises(ArtifactError) as caught:
        validator = Validator()
        validator.feed(data)
        validator.finish()
    assert caught.value.code == code, caught.value
    assert caught.value.code in CODES and caught.value.where and caught.value.sentence
    return caught.value


def mutated(base: bytes, change) -> bytes:
    pieces = surgery.split(base)
    change(pieces)
    return surgery.join(pieces)


def test_tiny_model_is_valid(tiny_slm):
    model = validate_bytes(tiny_slm)
    assert model.architecture.gemma3.layer_types == tuple(LAYER_TYPES)
    assert set(fmt.required_tensors(ARCHITECTURE)) - set(fmt.required_tensors(dict(ARCHITECTURE, family="llama"))) \
        == {f"blk.{i}.{n}" for i in range(3) for n in ("attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm")}


@pytest.mark.parametrize("key, value", [
    ("embedding_scale", 0), ("embedding_scale", -8.0), ("embedding_scale", "8"),
    ("norm_weight_offset", 0.5), ("norm_weight_offset", 2), ("norm_weight_offset", True),
    ("activation", "gelu"), ("activation", None),
    ("attention_scale", 0.0), ("attention_scale", 1e300),
    ("sliding_window", 0), ("sliding_window", 65), ("sliding_window", 8.0),
    ("local_rope_base", 0), ("local_rope_base", -1.0),
])
def test_bad_gemma3_field(tiny_slm, key, value):
    err = expect("bad-field", mutated(tiny_slm, lambda p: p.manifest["architecture"]["gemma3"].__setitem__(key, value)))
    assert err.where == f"manifest.architecture.gemma3.{key}"


@pytest.mark.parametrize("change, code", [
    (lambda a: a["gemma3"].pop("local_rope_base"), "bad-field"),
    (lambda a: a["gemma3"].update(final_logit_softcap=30.0), "bad-field"),
    (lambda a: a.pop("gemma3"), "bad-field"),                              # gemma3 without its section
    (lambda a: a.update(family="llama"), "bad-field"),                      # llama with a gemma3 section
    (lambda a: a.update(gemma3=[1, 2]), "bad-field"),
    (lambda a: a["gemma3"].update(layer_types=["sliding", "full"]), "bad-architecture"),
    (lambda a: a["gemma3"].update(layer_types=["sliding", "global", "full"]), "bad-architecture"),
    (lambda a: a["gemma3"].update(layer_types="sliding"), "bad-architecture"),
], ids=["missing-key", "extra-key", "no-section", "llama-with-section", "not-object", "layer-count",
        "layer-type", "layer-types-string"])
def test_bad_gemma3_section(tiny_slm, change, code):
    expect(code, mutated(tiny_slm, lambda p: change(p.manifest["architecture"])))


def test_gemma3_tensor_set(tiny_slm):
    def drop_q_norm(p):
        e = next(e for e in p.table["tensors"] if e["name"] == "blk.1.attn_q_norm")
        e["name"] = "blk.1.attn_q_norm_x"
    expect("unexpected-tensor", mutated(tiny_slm, drop_q_norm))

    def reshape_k_norm(p):
        e = next(e for e in p.table["tensors"] if e["name"] == "blk.0.attn_k_norm")
        e["shape"] = [64]
    expect("bad-shape", mutated(tiny_slm, reshape_k_norm))


@pytest.mark.parametrize("change, code", [
    (lambda t: t.pop("added_tokens"), "bad-field"),                          # "gemma" needs the list
    (lambda t: t.update(pre_tokenizer="sentencepiece"), "bad-field"),        # ... and only "gemma" has it
    (lambda t: t.update(added_tokens={"id": 6}), "bad-tokenizer"),
    (lambda t: t["added_tokens"].append({"id": 300, "content": "x"}), "bad-tokenizer"),
    (lambda t: t["added_tokens"].append({"id": 12, "content": "x"}), "bad-tokenizer"),
    (lambda t: t["added_tokens"].append({"id": 4, "content": "<start_of_turn>"}), "bad-tokenizer"),
    (lambda t: t["added_tokens"].append({"id": 12}), "bad-field"),
    (lambda t: t.update(byte_level=True, byte_fallback=False), "bad-tokenizer"),
], ids=["missing", "sentencepiece-with-added", "not-list", "id-range", "content", "also-special",
        "entry-key", "byte-level"])
def test_bad_gemma_tokenizer(tiny_slm, change, code):
    expect(code, mutated(tiny_slm, lambda p: change(p.manifest["tokenizer"])))
