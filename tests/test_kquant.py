"""q5 and the super-block encodings (q4k, q5k, q6k): lossless from GGUF, decoded bit-identically
to gguf.quants, validated field by field, run by the CPU path, refused by GPU admission.

Blocks are random GGUF bytes with adversarial scales and codes (tests/kquant_model.py): the
largest finite f16, subnormals, signed zeros, negative scales and mins, codes all at their
maximum or minimum, K sub-scales at 0 and 63, Q6_K sub-scales at -128 and 127. f16 NaN and
infinity are not values a block may hold: the converter and the validator refuse them.
"""
from __future__ import annotations


import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402

import kquant_model  # noqa: E402
import slm_surgery as surgery  # noqa: E402
from webslm.artifact import ArtifactError, Validator, validate_bytes  # noqa: E402
from webslm.artifact import format as fmt  # noqa: E402
from webslm.artifact.errors import CODES  # noqa: E402
from webslm.artifact.quant import dequantize  # noqa: E402
from webslm.artifact.writer import quant_descriptor  # noqa: E402
from webslm.convert import ConversionError  # noqa: E402
from webslm.convert.gguf import convert_gguf  # noqa: E402
from webslm.convert.gguf_blocks import LOSSLESS, join_blocks, split_blocks  # noqa: E402

NEW_TYPES = [GT.Q5_0, GT.Q5_1, GT.Q4_K, GT.Q5_K, GT.Q6_K]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as f32 bit patterns (so -0.0 differs from 0.0)."""
    return a.dtype == b.dtype == np.float32 and a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


# -- the codecs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", list(LOSSLESS), ids=lambda t: t.name)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_blocks_round_trip_and_decode_bit_identically_to_gguf(qtype, seed):
    rng = np.random.default_rng(seed)
    encoding, zero, block, _ = LOSSLESS[qtype]
    rows, nblocks = 7, 5
    raw = kquant_model.gguf_blocks(qtype, rows, nblocks, rng)
    got_encoding, got_zero, parts = split_blocks(qtype, raw)
    assert (got_encoding, got_zero) == (encoding, zero)
    assert list(parts) == list(fmt.PARTS[(encoding, zero)])
    cols = nblocks * block
    lengths = fmt.part_lengths(encoding, zero, rows, cols, block)
    assert {k: len(v) for k, v in parts.items()} == lengths
    assert np.array_equal(join_blocks(qtype, parts, rows, cols), raw)         # every bit kept
    reference = gguf.quants.dequantize(raw, qtype).reshape(rows, cols)
    ours = dequantize(encoding, (rows, cols), quant_descriptor(encoding, cols, block, zero), parts)
    assert same_bits(ours, reference)


@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda t: t.name)
def test_extreme_codes_reach_the_ends_of_their_range(qtype):
    """The adversarial blocks really hold every code at its maximum (row 0, block 0) and at 0
    (block 1), K sub-scales and sub-mins at 63 and 0, and decode like gguf there too."""
    from webslm.artifact.quant import unpack_codes
    rng = np.random.default_rng(5)
    raw = kquant_model.gguf_blocks(qtype, 2, 2, rng)
    encoding, zero, block, _ = LOSSLESS[qtype]
    _, _, parts = split_blocks(qtype, raw)
    codes = unpack_codes(encoding, parts, 2, 2 * block)
    assert (codes[0, :block] == 2 ** fmt.CODE_BITS[encoding] - 1).all() and (codes[0, block:] == 0).all()
    if encoding in ("q4k", "q5k"):
        for part in ("sub_scales", "sub_mins"):
            values = np.frombuffer(parts[part], np.uint8).reshape(2, 2, 8)
            assert (values[0, 0] == 63).all() and (values[0, 1] == 0).all()
    reference = gguf.quants.dequantize(raw, qtype).reshape(2, -1)
    assert same_bits(dequantize(encoding, (2, 2 * block), quant_descriptor(encoding, 2 * block, block, zero), parts),
                     reference)


def test_q5_with_other_block_sizes_decodes_by_the_formula():
    """q5 is not tied to GGUF's 32-blocks: a 64-block q5 'min' tensor decodes as
    scale * code + min with code = low nibble | high bit << 4."""
    rng = np.random.default_rng(3)
    rows, cols, block = 3, 128, 64
    codes = rng.integers(0, 32, (rows, cols), dtype=np.uint8)
    scales = rng.standard_normal((rows, cols // block)).astype("<f4")
    mins = rng.standard_normal((rows, cols // block)).astype("<f4")
    from webslm.artifact.quant import pack_high_bits, pack_nibbles
    parts = {"codes": pack_nibbles(codes & 15).tobytes(), "high_bits": pack_high_bits(codes >> 4, 1).tobytes(),
             "scales": scales.tobytes(), "mins": mins.tobytes()}
    got = dequantize("q5", (rows, cols), quant_descriptor("q5", cols, block, "min", "f32"), parts)
    want = (np.repeat(scales, block, axis=1) * codes.astype(np.float32) + np.repeat(mins, block, axis=1))
    assert same_bits(got, want.astype(np.float32))


# -- a model of every new kind, validated -------------------------------------------------------

@pytest.fixture(scope="module")
def kquant_slm(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("kquant") / "kquant.slm"
    kquant_model.kquant_slm(path)
    return path.read_bytes()


def test_model_validates_and_decodes_like_gguf(kquant_slm):
    model = validate_bytes(kquant_slm)
    _, raw = kquant_model.kquant_records()
    kinds = {(i.encoding, i.quant.zero) for i in model.manifest.tensors.values() if i.quant}
    assert kinds >= {("q5", "offset"), ("q5", "min"), ("q4k", "scaled-min"), ("q5k", "scaled-min"), ("q6k", "offset")}
    for name, rows in raw.items():
        qtype = kquant_model.GGUF_TYPES[name]
        reference = gguf.quants.dequantize(rows, qtype).reshape(model.manifest.tensors[name].shape)
        assert same_bits(model.dequantize(name), reference), name


def test_tensor_arrays_give_each_part_its_type(kquant_slm):
    model = validate_bytes(kquant_slm)
    q6 = model.tensor_arrays("blk.0.attn_v")                 # [128, 256] q6k: one super-block a row
    assert list(q6) == ["codes", "high_bits", "scales", "sub_scales"]
    assert (q6["codes"].shape, q6["high_bits"].shape, q6["scales"].dtype, q6["sub_scales"].dtype) == \
        ((128, 128), (128, 64), np.dtype("<f2"), np.dtype(np.int8))
    q4k = model.tensor_arrays("blk.0.attn_q")
    assert (q4k["sub_scales"].shape, q4k["sub_mins"].dtype, q4k["mins"].dtype) == ((256, 8), np.dtype(np.uint8), np.dtype("<f2"))


# -- the malformed corpus for every new field ------------------------------------------------------

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


def entry(pieces, name: str) -> dict:
    return next(e for e in pieces.table["tensors"] if e["name"] == name)


Q4K, Q5K, Q6K, Q5_0, Q5_1 = "blk.0.attn_q", "blk.0.attn_k", "blk.0.attn_v", "blk.0.attn_output", "blk.0.ffn_gate"


@pytest.mark.parametrize("name, key, value", [
    (Q4K, "block_elements", 128), (Q6K, "block_elements", 32), (Q5_0, "block_elements", 48),
    (Q5_0, "block_elements", 512),                   # not a block size
    (Q4K, "blocks_per_row", 2), (Q6K, "tail_elements", 128),
    (Q4K, "scale_type", "f32"),                       # super-blocks carry f16 scales only
    (Q5_0, "scale_type", "bf16"),
    (Q4K, "zero", "min"), (Q6K, "zero", "scaled-min"), (Q5_0, "zero", "none"), (Q5_1, "zero", "scaled-min"),
    (Q6K, "zero_offset", 8), (Q5_0, "zero_offset", 8), (Q5_1, "zero_offset", 16),
    (Q4K, "min_type", None), (Q6K, "min_type", "f16"), (Q5_1, "min_type", "f32"),
    (Q5K, "code_signedness", "signed"), (Q5_0, "nibble_order", "high-first"), (Q6K, "nibble_order", None),
    (Q4K, "scale_layout", "blocks-by-rows"),
    (Q4K, "sub_block_elements", 16), (Q6K, "sub_block_elements", 32), (Q5K, "sub_block_elements", 32.0),
    (Q4K, "sub_scale_type", "u8"), (Q6K, "sub_scale_type", "u6"),
    (Q5K, "sub_min_type", None), (Q6K, "sub_min_type", "u6"),
])
def test_bad_descriptor_field(kquant_slm, name, key, value):
    err = expect("bad-encoding", mutated(kquant_slm, lambda p: entry(p, name)["quant"].__setitem__(key, value)))
    assert err.where.startswith(name)


@pytest.mark.parametrize("name, change", [
    (Q4K, lambda q: q.pop("sub_min_type")),                       # a super-block key missing
    (Q5_0, lambda q: q.update(sub_block_elements=32)),             # a super-block key on q5
    (Q6K, lambda q: q.update(code_bits=6)),                        # a key of no encoding
])
def test_descriptor_key_set_depends_on_the_encoding(kquant_slm, name, change):
    expect("bad-field", mutated(kquant_slm, lambda p: change(entry(p, name)["quant"])))


def test_new_encodings_are_matrices_only(kquant_slm):
    def change(p):
        e = entry(p, "blk.0.attn_norm")
        e["encoding"], e["quant"] = "q5", {"block_elements": 32}
    expect("bad-encoding", mutated(kquant_slm, change))


@pytest.mark.parametrize("name, part, delta", [
    (Q5_0, "high_bits", 4), (Q5K, "high_bits", -32), (Q6K, "high_bits", 64),
    (Q4K, "sub_scales", 8), (Q4K, "sub_mins", -8), (Q6K, "sub_scales", 16), (Q5_1, "mins", 2),
])
def test_bad_part_length(kquant_slm, name, part, delta):
    def change(p):
        entry(p, name)["parts"][part][1] += delta
    err = expect("bad-layout", mutated(kquant_slm, change))
    assert err.where == f"{name}.parts.{part}"


@pytest.mark.parametrize("name, part", [(Q5_0, "high_bits"), (Q5K, "sub_mins"), (Q6K, "sub_scales"), (Q4K, "mins")])
def test_missing_part(kquant_slm, name, part):
    expect("bad-layout", mutated(kquant_slm, lambda p: entry(p, name)["parts"].pop(part)))


def test_parts_out_of_file_order(kquant_slm):
    """sub_scales must follow mins: swapping their spans puts a part before its predecessor."""
    def change(p):
        parts = entry(p, Q4K)["parts"]
        parts["mins"], parts["sub_scales"] = parts["sub_scales"], parts["mins"]
    expect("bad-layout", mutated(kquant_slm, change))


@pytest.mark.parametrize("name, part", [(Q4K, "sub_scales"), (Q4K, "sub_mins"), (Q5K, "sub_scales"), (Q5K, "sub_mins")])
def test_u6_sub_scales_above_63_are_out_of_range(kquant_slm, name, part):
    def change(p):
        offset, length = entry(p, name)["parts"][part]
        p.payload[offset + length - 1] = 64
    err = expect("out-of-range", mutated(kquant_slm, change))
    assert err.where == f"{name}.{part}"


def test_i8_sub_scales_take_every_byte(kquant_slm):
    """q6k's sub-scales are int8: -128 and 127 are values, not defects."""
    def change(p):
        offset, _ = entry(p, Q6K)["parts"]["sub_scales"]
        p.payload[offset:offset + 2] = bytes([0x80, 0x7F])
    model = validate_bytes(mutated(kquant_slm, change))
    assert model.tensor_arrays(Q6K)["sub_scales"][0, :2].tolist() == [-128, 127]


@pytest.mark.parametrize("name, part, value", [
    (Q4K, "scales", np.inf), (Q5K, "mins", np.nan), (Q6K, "scales", -np.inf), (Q5_0, "scales", np.nan),
    (Q5_1, "mins", np.inf)])
def test_non_finite_scales_and_mins(kquant_slm, name, part, value):
    def change(p):
        offset, _ = entry(p, name)["parts"][part]
        p.payload[offset:offset + 2] = np.array([value], "<f2").tobytes()
    err = expect("non-finite", mutated(kquant_slm, change))
    assert err.where == f"{name}.{part}"


def test_a_flipped_high_bit_fails_the_tensor_hash(kquant_slm):
    pieces = surgery.split(kquant_slm)
    offset, _ = entry(pieces, Q5K)["parts"]["high_bits"]
    pieces.payload[offset] ^= 1
    err = expect("tensor-hash", surgery.join(pieces, rehash=False))
    assert err.where == Q5K


# -- the converter ------------------------------------------------------------------------------

def write_gguf(path, types: dict, nan_scale: str | None = None, adversarial: bool = True) -> dict:
    """kquant_model's architecture as a llama GGUF, each matrix raw blocks of `types`."""
    a = kquant_model.ARCHITECTURE
    rng = np.random.default_rng(11)
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(a["n_layers"])
    w.add_context_length(a["context_length"])
    w.add_embedding_length(a["hidden"])
    w.add_feed_forward_length(a["ffn"])
    w.add_head_count(a["n_heads"])
    w.add_head_count_kv(a["n_kv_heads"])
    w.add_rope_freq_base(a["rope"]["base"])
    w.add_layer_norm_rms_eps(a["norm_eps"])
    tok = kquant_model.fixture.fixture_tokenizer()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tok["tokens"])
    w.add_token_merges(tok["merges"])
    w.add_bos_token_id(tok["bos_id"])
    w.add_eos_token_id(tok["eos_ids"][0])
    w.add_chat_template(kquant_model.fixture.CHAT_TEMPLATE)
    raw = {}
    for name, shape in fmt.required_tensors(a).items():
        if len(shape) == 1:
            w.add_tensor(name + ".weight", (1 + 0.1 * rng.standard_normal(shape[0])).astype(np.float32))
            continue
        qtype = types[name]
        block = LOSSLESS[qtype][2]
        raw[name] = kquant_model.gguf_blocks(qtype, shape[0], shape[1] // block, rng, adversarial)
        if name == nan_scale:                          # row 3's first block: d is last in Q6_K, first elsewhere
            d_at = 208 if qtype == GT.Q6_K else 0
            raw[name][3, d_at:d_at + 2] = np.array([np.nan], "<f2").view(np.uint8)
        w.add_tensor(name + ".weight", raw[name], raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return raw


def test_converter_keeps_every_new_type_losslessly(tmp_path):
    from test_convert_gguf import hf_from_gguf, reference
    write_gguf(tmp_path / "k.gguf", kquant_model.GGUF_TYPES)
    report = convert_gguf(tmp_path / "k.gguf", tmp_path / "k.slm")
    assert report.requantized == {} and len(report.lossless) == report.tensors
    model = validate_bytes((tmp_path / "k.slm").read_bytes())
    heads = {"blk.0.attn_q": model.architecture.n_heads, "blk.0.attn_k": model.architecture.n_kv_heads}
    for tensor in gguf.GGUFReader(tmp_path / "k.gguf").tensors:
        name = tensor.name.removesuffix(".weight")
        expected = reference(tensor)
        if name in heads:                              # llama: Q/K rows un-permuted, whole rows move
            expected = hf_from_gguf(expected, heads[name])
        assert same_bits(model.dequantize(name), expected), name
    got = {n: model.manifest.tensors[n].encoding for n in kquant_model.GGUF_TYPES}
    assert got == {n: LOSSLESS[t][0] for n, t in kquant_model.GGUF_TYPES.items()}


@pytest.mark.parametrize("name", ["blk.0.attn_output", "blk.0.ffn_down"])
def test_converter_refuses_a_nan_scale(tmp_path, name):
    write_gguf(tmp_path / "n.gguf", kquant_model.GGUF_TYPES, nan_scale=name)
    with pytest.raises(ConversionError, match=rf"tensor {name}: a Q\w+ block has a NaN or infinite scale"):
        convert_gguf(tmp_path / "n.gguf", tmp_path / "n.slm")
    assert not (tmp_path / "n.slm").exists()


def test_converter_can_still_requantize_k_types(tmp_path):
    write_gguf(tmp_path / "k.gguf", kquant_model.GGUF_TYPES, adversarial=False)
    report = convert_gguf(tmp_path / "k.gguf", tmp_path / "k.slm", quant="q8")
    model = validate_bytes((tmp_path / "k.slm").read_bytes())
    assert {i.encoding for n, i in model.manifest.tensors.items() if len(i.shape) == 2} == {"q8"}
    assert set(report.requantized) == set(kquant_model.GGUF_TYPES) - {"token_embd"}


def test_requantizing_values_beyond_f16_scales_is_a_conversion_error(tmp_path):
    """Adversarial K blocks reach 65504 * 63 * 31: no f16 q8 scale holds that."""
    write_gguf(tmp_path / "k.gguf", kquant_model.GGUF_TYPES)
    with pytest.raises(ConversionError, match="overflow q8.s f16 scales or values"):
        convert_gguf(tmp_path / "k.gguf", tmp_path / "k.slm", quant="q8")
    assert not (tmp_path / "k.slm").exists()


# -- the CPU path and GPU admission ---------------------------------------------------------------

def test_cpu_path_on_new_encodings_equals_the_same_model_in_f32(tmp_path):
    """CpuBackend over q5/q4k/q5k/q6k tensors computes exactly what it computes over their
    gguf-dequantized values stored as f32 (ordinary scales here: adversarial ones overflow),
    both strip by strip in numpy (the q8 kernel's own check: tests/test_cpu_qmatmul.py)."""
    from webslm.artifact.quant import encode_f32
    from webslm.artifact.writer import TensorRecord, write_slm
    from webslm.cpu import CpuBackend
    rng = np.random.default_rng(21)
    records, f32_records = [], []
    for record in kquant_model.kquant_records()[0]:
        if record.quant is None:
            records.append(record)
            f32_records.append(record)
            continue
        qtype = kquant_model.GGUF_TYPES[record.name]
        rows, cols = record.shape
        raw = kquant_model.gguf_blocks(qtype, rows, cols // LOSSLESS[qtype][2], rng, adversarial=False)
        encoding, zero, parts = split_blocks(qtype, raw)
        quant = quant_descriptor(encoding, cols, LOSSLESS[qtype][2], zero)
        records.append(type(record)(record.name, record.shape, encoding, quant, parts))
        f32 = gguf.quants.dequantize(raw, qtype).reshape(rows, cols)
        f32_records.append(TensorRecord(record.name, record.shape, "f32", None, encode_f32(f32)))
    write_slm(tmp_path / "k.slm", kquant_model.kquant_manifest(), records)
    write_slm(tmp_path / "f.slm", kquant_model.kquant_manifest(), f32_records)
    quantized = CpuBackend(validate_bytes((tmp_path / "k.slm").read_bytes()), use_kernel=False)
    plain = CpuBackend(validate_bytes((tmp_path / "f.slm").read_bytes()), use_kernel=False)
    ids = [5, 17, 99, 250, 3]
    a, b = quantized.prefill(ids), plain.prefill(ids)
    assert np.isfinite(a).all() and a.std() > 0
    assert same_bits(a, b)
    assert same_bits(quantized.decode_one(42), plain.decode_one(42))


def test_gpu_admission_takes_every_new_encoding(kquant_slm):
    """The GPU kernels read q5 and the super-blocks (tests/test_kernels_kquant.py), so this
    model's encodings pass admission's derive stage; its random GGUF scales (up to 65504 times
    sub-scale 63) overflow f32 in both paths, so logits are compared on the synthetic models
    of tests/test_gpu_kquant_native.py instead."""
    from webslm.admission.pipelines import unsupported
    import webslm
    assert unsupported(webslm.open_model(kquant_slm).manifest) is None
