"""Hugging Face safetensors directory -> .slm (webslm.convert.safetensors).

The source is a tiny Qwen2/Llama-style directory built here: the fixture model's random
weights under their Hugging Face names (f32, f16 or bf16 safetensors, one file or two shards
with an index), a config.json, a tokenizer.json written by the `tokenizers` library, a
tokenizer_config.json with a ChatML template, a generation_config.json. Outputs are read back
with tests/test_fixture.py's independent reader and checked against the codecs' error bounds.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import safetensors.numpy
from safetensors import TensorSpec, serialize_file

from webslm import cli, fixture
from webslm.artifact import format as fmt
from webslm.convert import ConversionError
from webslm.convert.hf_tokenizer import LLAMA3_SPLIT, QWEN2_SPLIT
from webslm.convert.safetensors import convert_safetensors

from slm_reading import assert_within_bound, read_slm

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: E402

# Spelled out rather than taken from the converter, so a wrong mapping there cannot agree with itself.
HF_NAMES = {"token_embd": "model.embed_tokens.weight", "output_norm": "model.norm.weight",
            "output": "lm_head.weight"}
for _layer in range(2):
    for _ours, _theirs in {
        "attn_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight",
        "attn_q": "self_attn.q_proj.weight", "attn_k": "self_attn.k_proj.weight",
        "attn_v": "self_attn.v_proj.weight", "attn_output": "self_attn.o_proj.weight",
        "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
        "attn_v.bias": "self_attn.v_proj.bias", "ffn_gate": "mlp.gate_proj.weight",
        "ffn_up": "mlp.up_proj.weight", "ffn_down": "mlp.down_proj.weight",
    }.items():
        HF_NAMES[f"blk.{_layer}.{_ours}"] = f"model.layers.{_layer}.{_theirs}"

CHATML = fixture.CHAT_TEMPLATE
TOKENS = fixture.fixture_tokenizer()["tokens"]          # 256 bytes, the merges, 3 specials
N_PLAIN = 256 + len(fixture.MERGES)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bits (uint16), round to nearest even, as torch does."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def byte_level_tokenizer(pre_tokenizer=None, ignore_merges=False) -> Tokenizer:
    vocab = {token: i for i, token in enumerate(TOKENS[:N_PLAIN])}
    merges = [tuple(m.split(" ")) for m in fixture.MERGES]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in fixture.SPECIAL_TOKENS])
    return tok


def write_model(root, *, dtype="f32", kind="qwen2", shards=1, tokenizer=None, config=None, drop=(),
                extra=None, tokenizer_config=None, generation=True) -> dict[str, np.ndarray]:
    """Write an HF-style model directory; return the source values by .slm name (after the
    source dtype's rounding, i.e. what the converter must reproduce)."""
    root.mkdir(parents=True, exist_ok=True)
    weights = fixture.fixture_weights()
    if kind == "llama":
        weights = {n: w for n, w in weights.items() if not n.endswith(".bias")}
    sources, tensors = {}, {}
    for name, w in weights.items():
        if HF_NAMES[name] in drop:
            continue
        if dtype == "bf16":
            bits = to_bf16(w)
            tensors[HF_NAMES[name]] = bits
            sources[name] = from_bf16(bits).astype(np.float64)
        else:
            stored = w.astype(np.float16 if dtype == "f16" else np.float32)
            tensors[HF_NAMES[name]] = stored
            sources[name] = stored.astype(np.float64)
    tensors.update(extra or {})
    names = sorted(tensors)
    groups = [names[i::shards] for i in range(shards)]
    weight_map = {}
    for n, group in enumerate(groups):
        file = "model.safetensors" if shards == 1 else f"model-{n + 1:05d}-of-{shards:05d}.safetensors"
        if dtype == "bf16":
            arrays = {k: np.ascontiguousarray(tensors[k]) for k in group}
            specs = {k: TensorSpec(dtype="bfloat16" if a.dtype == np.uint16 else "float32", shape=list(a.shape),
                                   data_ptr=a.ctypes.data, data_len=a.nbytes) for k, a in arrays.items()}
            serialize_file(specs, str(root / file), metadata={"format": "pt"})
        else:
            safetensors.numpy.save_file({k: tensors[k] for k in group}, root / file, metadata={"format": "pt"})
        weight_map.update({k: file for k in group})
    if shards > 1:
        (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    cfg = {"architectures": ["Qwen2ForCausalLM" if kind == "qwen2" else "LlamaForCausalLM"],
           "model_type": kind, "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 72, "vocab_size": 300,
           "max_position_embeddings": 64, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
           "rope_scaling": None, "hidden_act": "silu", "tie_word_embeddings": False,
           "bos_token_id": 296, "eos_token_id": 298, "torch_dtype": "float32"}
    if kind == "llama":
        cfg["attention_bias"] = False
    cfg.update(config or {})
    (root / "config.json").write_text(json.dumps(cfg))
    (tokenizer or byte_level_tokenizer()).save(str(root / "tokenizer.json"))
    tc = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
          "add_bos_token": False, "chat_template": CHATML}
    tc.update(tokenizer_config or {})
    (root / "tokenizer_config.json").write_text(json.dumps(tc))
    if generation:
        (root / "generation_config.json").write_text(json.dumps({
            "do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
            "repetition_penalty": 1.05, "max_new_tokens": 4096, "eos_token_id": [298, 296]}))
    return sources


def convert(src, tmp_path, name="out.slm", **options):
    out = tmp_path / name
    report = convert_safetensors(src, out, **options)
    return report, read_slm(out)


# -- values ------------------------------------------------------------------------------------

@pytest.mark.parametrize("quant, group", [("q4", None), ("q4", 64), ("q8", 32), ("q8", 64), ("f16", None), ("f32", None)])
def test_values_are_within_the_quantization_bound(tmp_path, quant, group):
    sources = write_model(tmp_path / "hf")
    report, slm = convert(tmp_path / "hf", tmp_path, quant=quant, group=group)
    block = group or 32
    assert list(slm.entries) == list(fmt.required_tensors(slm.manifest["architecture"]))
    assert report.tensors == len(slm.entries) == len(sources)
    assert report.sha256 == slm.sha256
    for name, source in sources.items():
        e = slm.entries[name]
        assert tuple(e["shape"]) == source.shape
        if source.ndim == 1:
            assert e["encoding"] == "f32"
        else:
            assert e["encoding"] == quant
            if quant in ("q4", "q8"):
                assert e["quant"]["block_elements"] == block and e["quant"]["scale_type"] == "f16"
                assert e["quant"]["zero"] == ("min" if quant == "q4" else "none")
        error = assert_within_bound(source, e, slm.parts[name])
        if error == 0:
            assert name in report.lossless and name not in report.requantized
        else:
            assert report.requantized[name] == pytest.approx(error, rel=1e-12)
    if quant == "f32":
        assert not report.requantized and len(report.lossless) == len(sources)
    if quant in ("q4", "q8"):
        matrices = [n for n, s in sources.items() if s.ndim == 2]
        assert set(matrices) <= set(report.requantized), "random matrices are never quantized exactly"


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_precision_sources_are_widened_exactly(tmp_path, dtype):
    sources = write_model(tmp_path / "hf", dtype=dtype)
    report, slm = convert(tmp_path / "hf", tmp_path, quant="f32")
    for name, source in sources.items():
        np.testing.assert_array_equal(slm.decode(name), source.astype(np.float32))
    assert not report.requantized
    # and the bf16 values really are coarser than the f32 originals (the test is not vacuous)
    original = fixture.fixture_weights()["blk.0.attn_q"]
    assert not np.array_equal(sources["blk.0.attn_q"], original)


def test_q4_from_bf16_within_bound(tmp_path):
    sources = write_model(tmp_path / "hf", dtype="bf16")
    _, slm = convert(tmp_path / "hf", tmp_path, quant="q4", group=64)
    for name, source in sources.items():
        assert_within_bound(source, slm.entries[name], slm.parts[name])


def test_sharded_directory_gives_the_same_tensors(tmp_path):
    write_model(tmp_path / "one")
    write_model(tmp_path / "two", shards=2)
    assert len(list((tmp_path / "two").glob("*.safetensors"))) == 2
    _, one = convert(tmp_path / "one", tmp_path, "one.slm", quant="q8")
    _, two = convert(tmp_path / "two", tmp_path, "two.slm", quant="q8")
    assert [e["sha256"] for e in one.entries.values()] == [e["sha256"] for e in two.entries.values()]
    assert one.manifest["source"]["sha256"] != two.manifest["source"]["sha256"]   # different files read


def test_output_is_deterministic(tmp_path):
    write_model(tmp_path / "hf")
    first, _ = convert(tmp_path / "hf", tmp_path, "a.slm")
    second, _ = convert(tmp_path / "hf", tmp_path, "b.slm")
    assert first.sha256 == second.sha256
    assert (tmp_path / "a.slm").read_bytes() == (tmp_path / "b.slm").read_bytes()


# -- manifest ----------------------------------------------------------------------------------

def test_architecture_tokenizer_template_and_generation(tmp_path):
    write_model(tmp_path / "hf")
    report, slm = convert(tmp_path / "hf", tmp_path)
    m = slm.manifest
    assert m["architecture"] == {
        "family": "llama", "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 12, "hidden": 48,
        "ffn": 72, "vocab": 300, "context_length": 64, "norm_eps": 1e-05, "tied_output": False,
        "qkv_bias": True,
        "rope": {"base": 10000.0, "rotary_dim": 12, "convention": "rotate-half", "position_offset": 0,
                 "scaling": None}}
    t = m["tokenizer"]
    assert t["tokens"] == TOKENS and t["merges"] == fixture.MERGES
    assert t["special_tokens"] == [{"id": 296 + i, "content": s} for i, s in enumerate(fixture.SPECIAL_TOKENS)]
    assert (t["model"], t["byte_level"], t["byte_fallback"], t["pre_tokenizer"]) == ("bpe", True, False, "gpt2")
    # bos_token null in tokenizer_config -> config.json's bos_token_id; eos: tokenizer_config first, then
    # generation_config's list, without repeats
    assert (t["bos_id"], t["eos_ids"], t["pad_id"], t["unk_id"]) == (296, [298, 296], 296, None)
    assert (t["add_bos"], t["add_eos"]) == (False, False)
    assert m["chat_template"] == {"format": "jinja", "template": CHATML}
    assert m["generation"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
                               "repetition_penalty": 1.05, "max_new_tokens": 64}
    assert any("capped" in note for note in report.notes)
    assert m["source"]["format"] == "safetensors" and m["source"]["file"] == "hf"
    assert m["source"]["notes"] == report.notes


def test_merges_as_strings_and_without_generation_config(tmp_path):
    write_model(tmp_path / "hf", generation=False)
    path = tmp_path / "hf" / "tokenizer.json"
    data = json.loads(path.read_text())
    assert isinstance(data["model"]["merges"][0], list)       # what tokenizers writes today
    data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
    path.write_text(json.dumps(data))
    report, slm = convert(tmp_path / "hf", tmp_path)
    assert slm.manifest["tokenizer"]["merges"] == fixture.MERGES
    assert slm.manifest["tokenizer"]["eos_ids"] == [298]       # tokenizer_config's, config.json agrees
    assert slm.manifest["generation"]["temperature"] == 0.0    # transformers' default: greedy
    assert slm.manifest["generation"]["max_new_tokens"] == 64


def test_llama_without_biases_and_partial_rotary(tmp_path):
    write_model(tmp_path / "hf", kind="llama", config={"partial_rotary_factor": 0.5, "rope_theta": 500000.0})
    _, slm = convert(tmp_path / "hf", tmp_path, quant="q8")
    a = slm.manifest["architecture"]
    assert (a["qkv_bias"], a["rope"]["rotary_dim"], a["rope"]["base"]) == (False, 6, 500000.0)
    assert not [n for n in slm.entries if n.endswith(".bias")]


def test_tied_embeddings(tmp_path):
    write_model(tmp_path / "hf", drop={"lm_head.weight"}, config={"tie_word_embeddings": True})
    _, slm = convert(tmp_path / "hf", tmp_path, quant="q8")
    assert slm.manifest["architecture"]["tied_output"] is True and "output" not in slm.entries

    embed = fixture.fixture_weights()["token_embd"]
    write_model(tmp_path / "same", drop={"lm_head.weight"}, config={"tie_word_embeddings": True},
                extra={"lm_head.weight": embed})
    report, slm = convert(tmp_path / "same", tmp_path, "same.slm", quant="q8")
    assert "output" not in slm.entries and any("lm_head" in n for n in report.notes)

    write_model(tmp_path / "differs", config={"tie_word_embeddings": True})
    with pytest.raises(ConversionError, match="lm_head.weight differs"):
        convert_safetensors(tmp_path / "differs", tmp_path / "x.slm")


@pytest.mark.parametrize("pre, ignore_merges, name", [
    (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]), False, "smollm"),
    (pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), False, "qwen2"),
    (pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), True, "llama3"),
])
def test_pre_tokenizer_detection(tmp_path, pre, ignore_merges, name):
    write_model(tmp_path / "hf", tokenizer=byte_level_tokenizer(pre, ignore_merges))
    _, slm = convert(tmp_path / "hf", tmp_path, quant="q8")
    assert slm.manifest["tokenizer"]["pre_tokenizer"] == name


@pytest.mark.parametrize("spelling", ["normalizer", "metaspace"])
def test_sentencepiece_byte_fallback(tmp_path, spelling):
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "h", "i", "hi", "▁hi"]
    tok = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[("h", "i"), ("▁", "hi")],
                               byte_fallback=True, unk_token="<unk>"))
    if spelling == "normalizer":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(s, special=True) for s in ["<unk>", "<s>", "</s>"]])
    assert tok.encode("hi").tokens == ["▁hi"]
    write_model(tmp_path / "hf", tokenizer=tok, generation=False, config={"bos_token_id": 1, "eos_token_id": 2},
                tokenizer_config={"bos_token": "<s>", "eos_token": "</s>", "pad_token": None,
                                  "add_bos_token": True})
    _, slm = convert(tmp_path / "hf", tmp_path, quant="q8")
    t = slm.manifest["tokenizer"]
    assert (t["byte_level"], t["byte_fallback"], t["pre_tokenizer"]) == (False, True, "sentencepiece")
    assert (t["bos_id"], t["eos_ids"], t["unk_id"], t["pad_id"], t["add_bos"]) == (1, [2], 0, None, True)
    assert t["tokens"] == pieces and t["merges"] == ["h i", "▁ hi"]


# -- errors ------------------------------------------------------------------------------------

def test_rope_scaling_is_rejected(tmp_path):
    write_model(tmp_path / "hf", config={"rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    with pytest.raises(ConversionError, match="rope_scaling"):
        convert_safetensors(tmp_path / "hf", tmp_path / "x.slm")


def test_missing_and_unexpected_tensors_are_named(tmp_path):
    write_model(tmp_path / "missing", drop={"model.layers.1.mlp.up_proj.weight"})
    with pytest.raises(ConversionError, match=r"missing model\.layers\.1\.mlp\.up_proj\.weight"):
        convert_safetensors(tmp_path / "missing", tmp_path / "x.slm")
    extra = {"model.layers.0.self_attn.o_proj.bias": np.linspace(-1, 1, 48, dtype=np.float32)}
    write_model(tmp_path / "extra", extra=extra)
    with pytest.raises(ConversionError, match=r"unexpected model\.layers\.0\.self_attn\.o_proj\.bias"):
        convert_safetensors(tmp_path / "extra", tmp_path / "x.slm")
    # a Llama model must not carry Qwen2's q/k/v biases
    write_model(tmp_path / "llama", kind="llama", extra={"model.layers.0.self_attn.q_proj.bias":
                                                         np.linspace(-1, 1, 48, dtype=np.float32)})
    with pytest.raises(ConversionError, match=r"unexpected model\.layers\.0\.self_attn\.q_proj\.bias"):
        convert_safetensors(tmp_path / "llama", tmp_path / "x.slm")
    assert not (tmp_path / "x.slm").exists(), "nothing is written for a rejected source"


def test_unknown_pre_tokenizer_is_rejected(tmp_path):
    write_model(tmp_path / "hf", tokenizer=byte_level_tokenizer(pre_tokenizers.Sequence([
        pre_tokenizers.Whitespace(), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])))
    with pytest.raises(ConversionError, match="unknown byte-level pre-tokenizer"):
        convert_safetensors(tmp_path / "hf", tmp_path / "x.slm")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(TOKENS)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    shutil.rmtree(tmp_path / "hf")
    write_model(tmp_path / "hf", tokenizer=tok)
    with pytest.raises(ConversionError, match="unknown pre-tokenizer"):
        convert_safetensors(tmp_path / "hf", tmp_path / "x.slm")


@pytest.mark.parametrize("change, message", [
    ({"config": {"architectures": ["MistralForCausalLM"]}}, "expected exactly one of"),
    ({"config": {"head_dim": 16}}, "hidden == n_heads"),
    ({"config": {"num_key_value_heads": 3}}, "not a multiple"),
    ({"config": {"hidden_act": "gelu"}}, "hidden_act"),
    ({"kind": "llama", "config": {"attention_bias": True}}, "o_proj"),
    ({"config": {"vocab_size": 200}}, "tokens but config.json vocab_size"),
    ({"config": {"intermediate_size": 64}}, "shape"),
    ({"tokenizer_config": {"chat_template": None}}, "no chat template"),
    ({"tokenizer_config": {"eos_token": "<|nope|>"}}, "not a token"),
])
def test_bad_sources_are_rejected(tmp_path, change, message):
    write_model(tmp_path / "hf", **change)
    with pytest.raises(ConversionError, match=message):
        convert_safetensors(tmp_path / "hf", tmp_path / "x.slm")


def test_bad_options_and_overflow(tmp_path):
    write_model(tmp_path / "hf")
    with pytest.raises(ConversionError, match="group must be one of"):
        convert_safetensors(tmp_path / "hf", tmp_path / "x.slm", quant="q4", group=48)
    with pytest.raises(ConversionError, match="quant must be one of"):
        convert_safetensors(tmp_path / "hf", tmp_path / "x.slm", quant="q3")
    with pytest.raises(ConversionError, match="q4 and q8 only"):
        convert_safetensors(tmp_path / "hf", tmp_path / "x.slm", quant="f16", group=32)
    big = fixture.fixture_weights()["blk.0.attn_q"] * 1e6            # beyond f16's 65504
    write_model(tmp_path / "big", drop={"model.layers.0.self_attn.q_proj.weight"},
                extra={"model.layers.0.self_attn.q_proj.weight": big})
    with pytest.raises(ConversionError, match="overflow f16"):
        convert_safetensors(tmp_path / "big", tmp_path / "x.slm", quant="f16")
    assert convert_safetensors(tmp_path / "big", tmp_path / "ok.slm", quant="f32").tensors == 27


def test_cli_convert(tmp_path, capsys):
    write_model(tmp_path / "hf")
    assert cli.main(["convert", str(tmp_path / "hf"), "-o", str(tmp_path / "cli.slm"), "--quant", "q8",
                     "--group", "64"]) == 0
    printed = capsys.readouterr().out
    assert read_slm(tmp_path / "cli.slm").sha256 in printed
    assert "requantized: 16" in printed                               # the 16 matrices; 11 vectors stay f32
    write_model(tmp_path / "bad", config={"rope_scaling": {"factor": 2.0}})
    assert cli.main(["convert", str(tmp_path / "bad"), "-o", str(tmp_path / "bad.slm")]) == 2
    assert "rope_scaling" in capsys.readouterr().err


def test_the_validator_accepts_converted_files(tmp_path):
    from webslm.artifact.validate import validate_file
    sources = write_model(tmp_path / "hf", dtype="bf16")
    for quant in ("q4", "q8", "f16"):
        report, slm = convert(tmp_path / "hf", tmp_path, f"{quant}.slm", quant=quant)
        model = validate_file(tmp_path / f"{quant}.slm")
        assert model.identity.artifact_sha256 == report.sha256
        for name in sources:
            np.testing.assert_array_equal(model.dequantize(name), slm.decode(name))
