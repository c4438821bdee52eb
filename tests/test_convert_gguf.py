"""GGUF -> .slm conversion (webslm.convert.gguf).

Two kinds of tests:
- the real default model (SmolLM2 135M Instruct Q4_1), when its GGUF is on disk: every tensor
  decodes bit-identically to gguf's own dequantization, Q/K rows are un-permuted in the right
  direction, the manifest states the documented facts, and conversion is deterministic;
- tiny GGUFs written here with gguf.GGUFWriter: lossless Q4_0/F16 paths, known HF-layout Q/K
  rows, qwen2 biases, unsupported tensor types and architectures, requantization.

Every output is read back through the project's validator (webslm.artifact.validate), so each
test also shows that the converter writes files the page will accept.
"""
import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402

from webslm.artifact.validate import validate_file  # noqa: E402
from webslm.convert import ConversionError  # noqa: E402
from webslm.convert.gguf import convert_gguf, unpermute_rows  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_CANDIDATES = (ROOT / ".assets" / "cache" / GGUF_NAME,)


def reference(tensor) -> np.ndarray:
    """gguf's own f32 values of a tensor, in our [rows, cols] shape."""
    shape = tuple(int(d) for d in reversed(tensor.shape))
    return gguf.quants.dequantize(np.asarray(tensor.data), GT(tensor.tensor_type)).reshape(shape)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: HF rows -> GGUF rows."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def hf_from_gguf(w: np.ndarray, n_head: int) -> np.ndarray:
    """The brief's inverse, written out independently of the converter."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------- the real model

@pytest.fixture(scope="module")
def smollm_gguf() -> Path:
    for path in GGUF_CANDIDATES:
        if path.is_file():
            return path
    pytest.skip(f"{GGUF_NAME} not found in {' or '.join(str(p.parent) for p in GGUF_CANDIDATES)} "
                "(python tools/assets.py extracts it)")


@pytest.fixture(scope="module")
def smollm(smollm_gguf, tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm") / "smollm.slm"
    report = convert_gguf(smollm_gguf, out)
    return report, validate_file(out), gguf.GGUFReader(smollm_gguf)


def test_every_tensor_decodes_bit_identically_to_gguf(smollm):
    report, model, reader = smollm
    arch = model.architecture
    assert report.tensors == len(reader.tensors) == len(model.manifest.tensors) == 272
    assert len(report.lossless) == 272 and report.requantized == {}
    for tensor in reader.tensors:
        name = tensor.name.removesuffix(".weight")
        expected = reference(tensor)
        if name.endswith(".attn_q"):
            expected = hf_from_gguf(expected, arch.n_heads)
        elif name.endswith(".attn_k"):
            expected = hf_from_gguf(expected, arch.n_kv_heads)
        got = model.dequantize(name)
        assert got.dtype == np.float32 and np.array_equal(got, expected), name


def test_encodings_follow_the_gguf_types(smollm):
    _, model, _ = smollm
    tensors = model.manifest.tensors
    embd, q, norm = tensors["token_embd"], tensors["blk.0.attn_q"], tensors["blk.0.attn_norm"]
    assert (embd.encoding, embd.quant.zero, embd.quant.block_elements) == ("q8", "none", 32)
    assert (q.encoding, q.quant.zero, q.quant.nibble_order) == ("q4", "min", "low-first")
    assert [part for part, _, _ in q.parts] == ["codes", "scales", "mins"]
    assert (norm.encoding, norm.shape) == ("f32", (576,))
    assert "output" not in tensors


def test_qk_rows_are_llama_cpp_permuted_back(smollm):
    """GGUF rows == llama.cpp's permute(our rows): ours are the Hugging Face layout."""
    _, model, reader = smollm
    gguf_tensors = {t.name: t for t in reader.tensors}
    for layer in (0, 29):
        for part, heads in (("attn_q", 9), ("attn_k", 3)):
            ours = model.dequantize(f"blk.{layer}.{part}")
            theirs = reference(gguf_tensors[f"blk.{layer}.{part}.weight"])
            assert not np.array_equal(ours, theirs)              # a permutation really happened
            assert np.array_equal(llama_cpp_permute(ours, heads), theirs)


def test_rotate_half_on_our_rows_equals_adjacent_pair_on_gguf_rows(smollm):
    """The semantic check: RoPE applied as each layout's convention gives the same q."""
    _, model, reader = smollm
    w_gguf = reference(next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight"))
    w_ours = model.dequantize("blk.0.attn_q")
    x = np.random.default_rng(0).standard_normal(576).astype(np.float32)
    hd, pos = 64, 7
    angle = pos * 100000.0 ** (-np.arange(hd // 2) * 2 / hd)
    cos, sin = np.cos(angle), np.sin(angle)
    q_ours = (w_ours @ x).reshape(9, hd)
    a, b = q_ours[:, :hd // 2], q_ours[:, hd // 2:]                        # rotate-half pairs i, i+hd/2
    rot_ours = np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=1)
    q_gguf = (w_gguf @ x).reshape(9, hd)
    a, b = q_gguf[:, 0::2], q_gguf[:, 1::2]                                # adjacent pairs 2i, 2i+1
    rot_gguf = np.stack([a * cos - b * sin, a * sin + b * cos], axis=2).reshape(9, hd)
    np.testing.assert_allclose(llama_cpp_permute(rot_ours.reshape(-1, 1), 9).ravel(),
                               rot_gguf.ravel(), rtol=1e-5, atol=1e-5)


def test_manifest_states_the_model(smollm, smollm_gguf):
    _, model, _ = smollm
    m = model.manifest
    assert dataclasses.asdict(m.architecture) == {
        "family": "llama", "n_layers": 30, "n_heads": 9, "n_kv_heads": 3, "head_dim": 64,
        "hidden": 576, "ffn": 1536, "vocab": 49152, "context_length": 8192, "norm_eps": 1e-05,
        "tied_output": True, "qkv_bias": False,
        "rope": {"base": 100000.0, "rotary_dim": 64, "convention": "rotate-half",
                 "position_offset": 0, "scaling": None}, "gemma3": None}
    tok = m.tokenizer
    assert (tok["model"], tok["byte_level"], tok["byte_fallback"], tok["pre_tokenizer"]) == \
        ("bpe", True, False, "smollm")
    assert len(tok["tokens"]) == 49152 and len(tok["merges"]) == 48900
    assert tok["merges"][0] == "Ġ t"
    assert [dict(t) for t in tok["special_tokens"][:3]] == [{"id": 0, "content": "<|endoftext|>"},
                                                            {"id": 1, "content": "<|im_start|>"},
                                                            {"id": 2, "content": "<|im_end|>"}]
    assert len(tok["special_tokens"]) == 17
    assert (tok["bos_id"], tok["eos_ids"], tok["pad_id"], tok["unk_id"]) == (1, (2,), 2, 0)
    assert (tok["add_bos"], tok["add_eos"]) == (False, False)
    template = m.chat_template
    assert template["format"] == "jinja"
    assert template["template"].startswith("{% for message in messages %}")
    assert "<|im_start|>" in template["template"] and "<|im_end|>" in template["template"]
    assert dict(m.generation) == {"temperature": 0.2, "top_p": 0.9, "top_k": 50, "min_p": 0.0,
                               "repetition_penalty": 1.0, "max_new_tokens": 512}
    src = m.source
    assert (src["format"], src["file"], src["converter"]) == ("gguf", GGUF_NAME, "webslm 0.1.0")
    assert src["sha256"] == hashlib.sha256(smollm_gguf.read_bytes()).hexdigest()


def test_identity_is_the_reported_sha256(smollm):
    report, model, _ = smollm
    assert model.identity.artifact_sha256 == report.sha256
    assert report.output.endswith("smollm.slm") and report.notes == list(model.manifest.source["notes"])


def test_conversion_is_deterministic(smollm, smollm_gguf, tmp_path):
    report, model, _ = smollm
    again = convert_gguf(smollm_gguf, tmp_path / "again.slm")
    assert again.sha256 == report.sha256 == model.identity.artifact_sha256
    assert hashlib.sha256((tmp_path / "again.slm").read_bytes()[:-32]).hexdigest() == report.sha256


# ---------------------------------------------------------------- tiny GGUFs

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 64, 2, 1, 256, 64     # head_dim 32; FFN 256 fits a K-quant block
HEAD_DIM = HIDDEN // HEADS
TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "ab"] + [f"t{i}" for i in range(54)]


def q4k_bytes(rows: int, cols: int, rng) -> np.ndarray:
    """Valid Q4_K blocks (256 elements, 144 bytes): finite f16 d/dmin, random scales and codes."""
    blocks = rng.integers(0, 256, (rows * cols // 256, 144), dtype=np.uint8)
    blocks[:, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    blocks[:, 2:4] = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


def write_tiny(path: Path, arch: str = "llama", ffn_down: str = "F32", hf_q=None) -> dict:
    """A one-layer model of every lossless GGUF type; returns the tensors as written (f32, HF rows)."""
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
    w.add_token_list(TOKENS)
    w.add_token_merges(["a b"])
    w.add_token_types([3, 3, 3] + [1] * (len(TOKENS) - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}")

    def weights(rows, cols):
        return rng.standard_normal((rows, cols)).astype(np.float32) * 0.1

    hf = {"blk.0.attn_q": weights(HIDDEN, HIDDEN) if hf_q is None else hf_q,
          "blk.0.attn_k": weights(KV_HEADS * HEAD_DIM, HIDDEN)}
    permuted = arch == "llama"                                  # as llama.cpp's converter does

    def stored(name, heads):
        return llama_cpp_permute(hf[name], heads) if permuted else hf[name]

    def add(name, values, qtype):
        if qtype in (GT.F32, GT.F16):
            w.add_tensor(name, values.astype(np.float16 if qtype == GT.F16 else np.float32))
        else:
            w.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)

    add("token_embd.weight", weights(VOCAB, HIDDEN), GT.Q8_0)
    add("blk.0.attn_norm.weight", 1 + weights(1, HIDDEN)[0], GT.F32)
    add("blk.0.attn_q.weight", stored("blk.0.attn_q", HEADS), GT.F32)   # exact: HF rows known
    add("blk.0.attn_k.weight", stored("blk.0.attn_k", KV_HEADS), GT.Q4_1)
    add("blk.0.attn_v.weight", weights(KV_HEADS * HEAD_DIM, HIDDEN), GT.Q4_0)
    add("blk.0.attn_output.weight", weights(HIDDEN, HIDDEN), GT.F16)
    add("blk.0.ffn_norm.weight", 1 + weights(1, HIDDEN)[0], GT.F16)
    add("blk.0.ffn_gate.weight", weights(FFN, HIDDEN), GT.Q4_1)
    add("blk.0.ffn_up.weight", weights(FFN, HIDDEN), GT.Q8_0)
    if ffn_down == "Q4_K":
        w.add_tensor("blk.0.ffn_down.weight", q4k_bytes(HIDDEN, FFN, rng), raw_dtype=GT.Q4_K)
    elif ffn_down == "BF16":
        bf16 = (weights(HIDDEN, FFN).view(np.uint32) >> 16).astype(np.uint16)
        w.add_tensor("blk.0.ffn_down.weight", bf16, raw_shape=(HIDDEN, FFN), raw_dtype=GT.BF16)
    else:
        add("blk.0.ffn_down.weight", weights(HIDDEN, FFN), GT.F32)
    add("output_norm.weight", 1 + weights(1, HIDDEN)[0], GT.F32)
    if arch == "qwen2":
        for part, rows in (("q", HIDDEN), ("k", KV_HEADS * HEAD_DIM), ("v", KV_HEADS * HEAD_DIM)):
            add(f"blk.0.attn_{part}.bias", weights(1, rows)[0], GT.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


def test_tiny_llama_converts_losslessly_with_hf_qk_rows(tmp_path):
    hf = write_tiny(tmp_path / "tiny.gguf")
    report = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "tiny.slm")
    model = validate_file(tmp_path / "tiny.slm")
    assert report.requantized == {} and len(report.lossless) == report.tensors == 11
    encodings = {n: (t.encoding, t.quant and t.quant.zero) for n, t in model.manifest.tensors.items()}
    assert encodings["blk.0.attn_v"] == ("q4", "offset")                 # Q4_0
    assert encodings["blk.0.attn_output"] == ("f16", None)               # F16 matrix
    assert encodings["blk.0.ffn_norm"] == ("f16", None)                  # F16 vector
    np.testing.assert_array_equal(model.dequantize("blk.0.attn_q"), hf["blk.0.attn_q"])
    for tensor in gguf.GGUFReader(tmp_path / "tiny.gguf").tensors:
        name = tensor.name.removesuffix(".weight")
        expected = reference(tensor)
        if name == "blk.0.attn_k":
            expected = hf_from_gguf(expected, KV_HEADS)
        elif name == "blk.0.attn_q":
            expected = hf_from_gguf(expected, HEADS)
        assert np.array_equal(model.dequantize(name), expected), name
    arch = model.architecture
    assert (arch.head_dim, arch.norm_eps, arch.qkv_bias, arch.tied_output) == (32, 1e-06, False, True)


def test_unpermute_rows_pairs_adjacent_rows_into_halves():
    # one head of 4 rows: GGUF holds the pairs (x0, x2), (x1, x3) adjacently as x0 x2 x1 x3
    assert unpermute_rows(1, 4).tolist() == [0, 2, 1, 3]
    rows = np.arange(2 * 8)[:, None]
    assert np.array_equal(rows[unpermute_rows(2, 16)], hf_from_gguf(rows, 2))
    assert np.array_equal(llama_cpp_permute(rows[unpermute_rows(2, 16)], 2), rows)


def test_qwen2_keeps_rows_and_converts_biases(tmp_path):
    hf = write_tiny(tmp_path / "qwen.gguf", arch="qwen2")
    convert_gguf(tmp_path / "qwen.gguf", tmp_path / "qwen.slm")
    model = validate_file(tmp_path / "qwen.slm")
    assert model.architecture.qkv_bias is True
    assert model.manifest.tokenizer["pre_tokenizer"] == "qwen2"
    np.testing.assert_array_equal(model.dequantize("blk.0.attn_q"), hf["blk.0.attn_q"])
    assert model.manifest.tensors["blk.0.attn_k.bias"].shape == (KV_HEADS * HEAD_DIM,)
    source = {t.name: t for t in gguf.GGUFReader(tmp_path / "qwen.gguf").tensors}
    for name in ("blk.0.attn_k", "blk.0.attn_q.bias", "blk.0.attn_k.bias"):   # rows kept as stored
        gguf_name = name if name.endswith(".bias") else name + ".weight"
        assert np.array_equal(model.dequantize(name), reference(source[gguf_name])), name


@pytest.mark.parametrize("kind", ["BF16"])     # Q4_K converts losslessly now: tests/test_kquant.py
def test_unsupported_tensor_type_needs_quant(tmp_path, kind):
    write_tiny(tmp_path / "k.gguf", ffn_down=kind)
    with pytest.raises(ConversionError, match=rf"blk\.0\.ffn_down\.weight has GGUF type {kind}.*quant"):
        convert_gguf(tmp_path / "k.gguf", tmp_path / "k.slm")
    assert not (tmp_path / "k.slm").exists()


def test_requantization_reports_its_error(tmp_path):
    write_tiny(tmp_path / "k.gguf", ffn_down="Q4_K")
    report = convert_gguf(tmp_path / "k.gguf", tmp_path / "k.slm", quant="q4")
    model = validate_file(tmp_path / "k.slm")
    # the Q4_K matrix and the F32/F16/Q8_0 matrices are requantized; Q4_0/Q4_1 are already q4/32
    assert set(report.requantized) == {"token_embd", "blk.0.attn_q", "blk.0.attn_output",
                                       "blk.0.ffn_up", "blk.0.ffn_down"}
    assert {"blk.0.attn_k", "blk.0.attn_v", "blk.0.ffn_gate", "blk.0.ffn_norm"} <= set(report.lossless)
    source = reference(next(t for t in gguf.GGUFReader(tmp_path / "k.gguf").tensors
                            if t.name == "blk.0.ffn_down.weight"))
    error = np.abs(model.dequantize("blk.0.ffn_down") - source).max()
    assert 0 < error == pytest.approx(report.requantized["blk.0.ffn_down"])
    assert error <= (source.max() - source.min()) / 15           # under one q4 step of the widest block
    assert model.manifest.tensors["blk.0.ffn_down"].quant.zero == "min"
    assert model.manifest.tensors["blk.0.ffn_norm"].encoding == "f32"       # vectors: f32 under quant
    assert any("requantized" in note for note in report.notes)


def test_requantization_with_another_group_touches_every_matrix(tmp_path):
    write_tiny(tmp_path / "t.gguf")
    report = convert_gguf(tmp_path / "t.gguf", tmp_path / "t.slm", quant="q8", group=64)
    model = validate_file(tmp_path / "t.slm")
    assert len(report.requantized) == 8                           # every 2-D matrix
    assert all(model.manifest.tensors[n].quant.block_elements == 64 for n in report.requantized)
    assert max(report.requantized.values()) < 0.01


def test_unsupported_architecture_is_named(tmp_path):
    w = gguf.GGUFWriter(tmp_path / "phi.gguf", "phi3")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ConversionError, match="architecture 'phi3' is not supported"):
        convert_gguf(tmp_path / "phi.gguf", tmp_path / "phi.slm")


def test_bad_arguments_are_conversion_errors(tmp_path):
    with pytest.raises(ConversionError, match="quant must be one of"):
        convert_gguf(tmp_path / "x.gguf", tmp_path / "x.slm", quant="q3")
    with pytest.raises(ConversionError, match="group"):
        convert_gguf(tmp_path / "x.gguf", tmp_path / "x.slm", group=64)
    with pytest.raises(ConversionError, match="group must be one of"):
        convert_gguf(tmp_path / "x.gguf", tmp_path / "x.slm", quant="q4", group=48)
    with pytest.raises(ConversionError, match="no such file"):
        convert_gguf(tmp_path / "x.gguf", tmp_path / "x.slm")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ConversionError, match="not a readable GGUF"):
        convert_gguf(tmp_path / "junk.gguf", tmp_path / "x.slm")


def test_cli_converts_and_reports_errors_in_one_line(tmp_path, capsys):
    from webslm.cli import main
    write_tiny(tmp_path / "t.gguf")
    assert main(["convert", str(tmp_path / "t.gguf"), "-o", str(tmp_path / "t.slm")]) == 0
    assert "11 tensors" in capsys.readouterr().out
    write_tiny(tmp_path / "k.gguf", ffn_down="BF16")
    assert main(["convert", str(tmp_path / "k.gguf"), "-o", str(tmp_path / "k.slm")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("webslm convert: tensor blk.0.ffn_down.weight has GGUF type BF16")
    assert err.count("\n") == 1
