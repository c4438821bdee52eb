"""The malformed-artifact corpus: one case (or more) per validation rule, each asserting its
stable error code. Every case starts from the valid fixture model and makes one defect with
tests/slm_surgery.py, re-hashing the rest so the validator reaches that defect as itself."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from webslm.artifact import ArtifactError, Validator, format as fmt, validate_bytes
from webslm.artifact.errors import CODES

import slm_surgery as surgery


def expect(code: str, data: bytes, **validator_args) -> ArtifactError:
    with pytest.raises(ArtifactError) as caught:
        validator = Validator(**validator_args)
        validator.feed(data)
        validator.finish()
    assert caught.value.code == code, caught.value
    assert caught.value.code in CODES and caught.value.where and caught.value.sentence
    return caught.value


def mutated(base: bytes, change, **join_args) -> bytes:
    pieces = surgery.split(base)
    change(pieces)
    return surgery.join(pieces, **join_args)


def first(pieces, predicate) -> dict:
    return next(e for e in pieces.table["tensors"] if predicate(e))


def first_span(e) -> list:
    """The [offset, length] of an entry's first part (mutable: it is the table's own list)."""
    return next(iter(e["parts"].values()))


def is_q4_with_tail(e):
    return e["encoding"] == "q4" and e["quant"]["tail_elements"] < e["quant"]["block_elements"]


def test_fixture_is_valid_and_roundtrips_through_surgery(fixture_slm):
    model = validate_bytes(fixture_slm)
    assert surgery.join(surgery.split(fixture_slm)) == fixture_slm
    kinds = {(i.encoding, i.quant.zero if i.quant else "none") for i in model.manifest.tensors.values()}
    # q5 and the super-block kinds have their own model and corpus: tests/test_kquant.py
    assert kinds == {k for k in fmt.PARTS if k[0] in ("f32", "f16", "q8", "q4")}, "the fixture must hold every tensor kind"


# -- header and framing --------------------------------------------------------------------

def test_truncated(fixture_slm):
    expect("truncated", fixture_slm[:-1])
    expect("truncated", fixture_slm[:100])
    expect("truncated", b"")


def test_trailing_bytes(fixture_slm):
    expect("trailing-bytes", fixture_slm + b"\0")


def test_bad_magic(fixture_slm):
    expect("bad-magic", b"GGUF" + fixture_slm[4:])


def test_bad_version(fixture_slm):
    expect("bad-version", mutated(fixture_slm, lambda p: None, header={"version": 2}))


@pytest.mark.parametrize("field, delta", [("header_length", -64), ("manifest_offset", 8), ("table_offset", 1),
                                          ("payload_offset", 256), ("file_length", 1), ("payload_alignment", 1)])
def test_bad_header_fields(fixture_slm, field, delta):
    fields = dict(zip(("magic", "version", "header_length", "manifest_offset", "manifest_length", "table_offset",
                       "table_length", "payload_offset", "payload_length", "file_length", "payload_alignment"),
                      fmt.HEADER.unpack_from(fixture_slm)))
    expect("bad-header", mutated(fixture_slm, lambda p: None, header={field: fields[field] + delta}))


def test_bad_header_reserved_bytes(fixture_slm):
    data = bytearray(fixture_slm)
    data[fmt.HEADER_LENGTH - 1] = 1
    expect("bad-header", bytes(data))


def test_too_large(fixture_slm):
    expect("too-large", mutated(fixture_slm, lambda p: None, header={"manifest_length": fmt.MAX_MANIFEST_BYTES + 1}))
    expect("too-large", fixture_slm, max_bytes=len(fixture_slm) - 1)


def test_file_hash(fixture_slm):
    data = bytearray(fixture_slm)
    data[-1] ^= 0xFF
    expect("file-hash", bytes(data))


def test_bad_padding_before_payload(fixture_slm):
    data = bytearray(fixture_slm)
    _, _, _, _, _, table_offset, table_length, payload_offset = fmt.HEADER.unpack_from(data)[:8]
    assert payload_offset > table_offset + table_length, "the fixture must have padding before its payload"
    data[table_offset + table_length] = 7
    expect("bad-padding", surgery.retrailer(data))


def test_bad_padding_between_parts(fixture_slm):
    def change(p):
        offset = first_span(first(p, lambda e: first_span(e)[0] > 0))[0]
        assert p.payload[offset - 1] == 0
        p.payload[offset - 1] = 1
    expect("bad-padding", mutated(fixture_slm, change))


# -- JSON and manifest fields --------------------------------------------------------------

def test_bad_json(fixture_slm):
    pieces = surgery.split(fixture_slm)
    raw = surgery.canonical_json(pieces.manifest)
    expect("bad-json", surgery.join(pieces, manifest_bytes=raw[:-1] + b',"format":"webslm.slm"}'))  # duplicate key
    expect("bad-json", surgery.join(pieces, manifest_bytes=raw.replace(b'"temperature":', b'"temperature":NaN,"x":', 1)))
    expect("bad-json", surgery.join(pieces, manifest_bytes=b"\xff" + raw[1:]))
    expect("bad-json", surgery.join(pieces, table_bytes=b"[" * 100000))


@pytest.mark.parametrize("path, value", [
    (("surplus",), 1),
    (("architecture", "n_layers"), 0),
    (("architecture", "n_layers"), 5000),
    (("architecture", "n_layers"), True),
    (("architecture", "norm_eps"), -1e-5),
    (("architecture", "family"), "gpt2"),
    (("architecture", "rope", "scaling"), {"type": "linear", "factor": 2.0}),
    (("architecture", "rope", "convention"), "interleaved"),
    (("generation", "top_p"), 0.0),
    (("generation", "max_new_tokens"), 10 ** 9),
    (("source", "sha256"), "ABC"),
    (("chat_template", "format"), "mustache"),
])
def test_bad_field(fixture_slm, path, value):
    def change(p):
        target = p.manifest
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    expect("bad-field", mutated(fixture_slm, change))


def test_missing_manifest_field(fixture_slm):
    expect("bad-field", mutated(fixture_slm, lambda p: p.manifest["architecture"].pop("qkv_bias")))


def test_bad_version_in_manifest(fixture_slm):
    expect("bad-version", mutated(fixture_slm, lambda p: p.manifest.update(version=2)))


@pytest.mark.parametrize("change", [
    lambda a: a.update(hidden=a["hidden"] + a["head_dim"]),                          # hidden != heads * head_dim
    lambda a: a.update(n_kv_heads=a["n_heads"] + 1),                                 # heads % kv != 0
    lambda a: a["rope"].update(rotary_dim=a["rope"]["rotary_dim"] - 1),             # odd rotary dim
    lambda a: a["rope"].update(rotary_dim=a["head_dim"] + 2),                       # rotary > head_dim
    lambda a: a["rope"].update(position_offset=a["context_length"]),
], ids=["hidden", "gqa", "rotary-odd", "rotary-wide", "offset"])
def test_bad_architecture(fixture_slm, change):
    expect("bad-architecture", mutated(fixture_slm, lambda p: change(p.manifest["architecture"])))


@pytest.mark.parametrize("change", [
    lambda t: t["tokens"].__setitem__(1, t["tokens"][0]),                  # duplicate token
    lambda t: t["merges"].append(t["tokens"][0] + " " + "never-a-token"),
    lambda t: t["special_tokens"].append({"id": 3, "content": "<|not the token|>"}),
    lambda t: t["eos_ids"].__setitem__(0, len(t["tokens"])),
    lambda t: t.update(tokens=t["tokens"] + ["x"] * 10 ** 4),              # more tokens than vocab
    lambda t: t.update(byte_level=not t["byte_level"]),
], ids=["duplicate", "merge", "special", "eos-range", "too-many", "byte-level"])
def test_bad_tokenizer(fixture_slm, change):
    err = expect("bad-tokenizer", mutated(fixture_slm, lambda p: change(p.manifest["tokenizer"])))
    assert "tokenizer" in err.where


# -- tensor table ------------------------------------------------------------------------

def test_missing_tensor(fixture_slm):
    def change(p):
        dropped = p.table["tensors"].pop()
        end = max(o + n for e in p.table["tensors"] for o, n in e["parts"].values())
        del p.payload[end:]
        assert dropped["name"]
    expect("missing-tensor", mutated(fixture_slm, change))


def test_unexpected_tensor(fixture_slm):
    expect("unexpected-tensor", mutated(fixture_slm, lambda p: p.table["tensors"][0].update(name="blk.99.attn_q")))


def test_duplicate_tensor(fixture_slm):
    def change(p):
        p.table["tensors"][1]["name"] = p.table["tensors"][0]["name"]
    expect("duplicate-tensor", mutated(fixture_slm, change))


def test_bad_shape(fixture_slm):
    def change(p):
        e = first(p, lambda e: len(e["shape"]) == 2)
        e["shape"] = e["shape"][::-1]
    expect("bad-shape", mutated(fixture_slm, change))


@pytest.mark.parametrize("change", [
    lambda p: first(p, lambda e: len(e["shape"]) == 1).update(encoding="q8"),
    lambda p: first(p, lambda e: e["encoding"] == "q8")["quant"].update(block_elements=48),
    lambda p: first(p, is_q4_with_tail)["quant"].update(tail_elements=1),
    lambda p: first(p, lambda e: e["encoding"] == "q4")["quant"].update(nibble_order="high-first"),
    lambda p: first(p, lambda e: e["encoding"] == "q8")["quant"].update(zero="min"),
    lambda p: first(p, lambda e: e["encoding"] == "f32").update(quant={"block_elements": 32}),
    lambda p: first(p, lambda e: e["encoding"] == "q4")["quant"].update(scale_type="bf16"),
], ids=["vector-q8", "block", "tail", "nibbles", "q8-min", "f32-quant", "scale-type"])
def test_bad_encoding(fixture_slm, change):
    expect("bad-encoding", mutated(fixture_slm, change))


@pytest.mark.parametrize("change", [
    lambda p: first(p, lambda e: e["encoding"] == "f16").update(row_stride=1),
    lambda p: first(p, lambda e: e["encoding"] == "q8")["parts"]["scales"].__setitem__(1, 2),
    lambda p: first_span(first(p, lambda e: first_span(e)[0] > 0)).__setitem__(0, first_span(first(p, lambda e: first_span(e)[0] > 0))[0] + 4),
    lambda p: p.payload.extend(bytes(256)),
    lambda p: first(p, lambda e: e["encoding"] == "q4" and e["quant"]["zero"] == "min")["parts"].pop("mins"),
], ids=["row-stride", "part-length", "misaligned", "payload-slack", "missing-part"])
def test_bad_layout(fixture_slm, change):
    expect("bad-layout", mutated(fixture_slm, change))


def test_overlap(fixture_slm):
    def change(p):
        second = p.table["tensors"][1]
        name = next(iter(second["parts"]))
        second["parts"][name][0] = 0        # back onto the first tensor's bytes
    expect("overlap", mutated(fixture_slm, change))


# -- payload values ------------------------------------------------------------------------

def test_bad_tail_q4(fixture_slm):
    def change(p):
        e = first(p, is_q4_with_tail)
        offset, length = e["parts"]["codes"]
        rows = e["shape"][0]
        last_byte_of_row0 = offset + e["row_stride"] - 1    # the tail block's last byte is padding
        p.payload[last_byte_of_row0] |= 0x80
        assert rows and length
    expect("bad-tail", mutated(fixture_slm, change))


def test_bad_tail_q8(fixture_slm):
    def change(p):
        e = first(p, lambda e: e["encoding"] == "q8" and e["quant"]["tail_elements"] < e["quant"]["block_elements"])
        p.payload[e["parts"]["codes"][0] + e["row_stride"] - 1] = 5
    expect("bad-tail", mutated(fixture_slm, change))


def test_tensor_hash(fixture_slm):
    def change(p):
        offset, length = p.table["tensors"][0]["parts"][next(iter(p.table["tensors"][0]["parts"]))]
        p.payload[offset + length // 2] ^= 0x01
    err = expect("tensor-hash", mutated(fixture_slm, change, rehash=False))
    assert err.where == surgery.split(fixture_slm).table["tensors"][0]["name"]


@pytest.mark.parametrize("kind", ["scale", "f32"])
def test_non_finite(fixture_slm, kind):
    def change(p):
        if kind == "scale":
            e = first(p, lambda e: e["encoding"] == "q4" and e["quant"]["scale_type"] == "f16")
            offset = e["parts"]["scales"][0]
            p.payload[offset:offset + 2] = np.array([np.nan], "<f2").tobytes()
        else:
            e = first(p, lambda e: e["encoding"] == "f32")
            offset = e["parts"]["data"][0]
            p.payload[offset:offset + 4] = struct.pack("<f", float("inf"))
    expect("non-finite", mutated(fixture_slm, change))


def test_out_of_range_sub_scale(tmp_path):
    """u6 sub-scales above 63 (the fixture has none: a model of random GGUF K blocks does;
    tests/test_kquant.py has the corpus of every q5 and super-block field)."""
    kquant_model = pytest.importorskip("kquant_model")
    kquant_model.kquant_slm(tmp_path / "k.slm")

    def change(p):
        e = first(p, lambda e: e["encoding"] == "q4k")
        p.payload[e["parts"]["sub_mins"][0]] = 0x40
    expect("out-of-range", mutated((tmp_path / "k.slm").read_bytes(), change))


# -- hostile numbers, strings and claims (issue 18) -----------------------------------------

def claiming(base: bytes, payload_length: int) -> bytes:
    """The file's header made to claim a payload of `payload_length` (and the matching
    file_length), consistently: only the real size can tell the claim is false."""
    payload_offset = fmt.HEADER.unpack_from(base)[7]
    return surgery.join(surgery.split(base), header={"payload_length": payload_length,
                                                     "file_length": payload_offset + payload_length + 32})


@pytest.mark.parametrize("feed", ["bytes", "stream"])
def test_a_small_file_claiming_a_gigabyte_allocates_nothing_for_the_claim(fixture_slm, feed):
    import tracemalloc
    head = claiming(fixture_slm, 1 << 30)[:4096]
    tracemalloc.start()
    try:
        if feed == "bytes":            # the size is known: the claim is refused at the header
            err = expect("truncated", head, expected_bytes=len(head))
            assert err.where == "header.file_length"
        else:                          # the size is unknown: the buffer grows as bytes arrive
            expect("truncated", head)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"traced peak {peak} bytes for a {len(head)}-byte file"


def test_the_real_size_must_be_the_declared_one(fixture_slm):
    expect("truncated", fixture_slm[:-1], expected_bytes=len(fixture_slm) - 1)
    expect("trailing-bytes", fixture_slm + b"\0", expected_bytes=len(fixture_slm) + 1)
    assert validate_bytes(fixture_slm).nbytes == len(fixture_slm)


def raw_manifest(base: bytes, old: bytes, new: bytes) -> bytes:
    pieces = surgery.split(base)
    raw = surgery.canonical_json(pieces.manifest)
    assert old in raw
    return surgery.join(pieces, manifest_bytes=raw.replace(old, new, 1))


def test_numbers_no_field_can_hold(fixture_slm):
    # past Python's 4300-digit int conversion limit: json.loads raises ValueError
    expect("bad-json", raw_manifest(fixture_slm, b'"top_k":40', b'"top_k":1' + b"0" * 5000))
    # a float field given an integer too large for a float: OverflowError in float()
    expect("bad-field", raw_manifest(fixture_slm, b'"norm_eps":1e-05', b'"norm_eps":1' + b"0" * 400))
    expect("bad-field", raw_manifest(fixture_slm, b'"temperature":0.7', b'"temperature":-1' + b"0" * 400))
    # 1e400 parses to infinity
    expect("bad-field", raw_manifest(fixture_slm, b'"top_p":0.9', b'"top_p":1e400'))


def test_integer_fields_refuse_floats(fixture_slm):
    def change(p):
        e = first(p, lambda e: e["encoding"] == "q8" and e["quant"]["tail_elements"] < e["quant"]["block_elements"])
        e["row_stride"] = float(e["row_stride"])      # equal as a number, not as a type
    expect("bad-layout", mutated(fixture_slm, change))
    expect("bad-field", mutated(fixture_slm, lambda p: p.manifest["generation"].update(top_k=40.0)))


@pytest.mark.parametrize("where", ["token", "template", "note", "key"])
def test_strings_with_a_lone_surrogate(fixture_slm, where):
    """JSON's \\ud800 escape is valid JSON text, but no UTF-8 string: a token holding one
    validated and then failed in the tokenizer."""
    pieces = surgery.split(fixture_slm)
    m = pieces.manifest
    if where == "token":
        m["tokenizer"]["tokens"][5] += "\ud800"
    elif where == "template":
        m["chat_template"]["template"] += "\udfff"
    elif where == "note":
        m["source"]["notes"].append("a\ud83d")
    else:
        m["source"]["\ud800"] = 1
    raw = json.dumps(m, sort_keys=True, separators=(",", ":")).encode()     # escapes, as a writer may
    assert b"\\ud" in raw
    expect("bad-json", surgery.join(pieces, manifest_bytes=raw))


def test_ranges_are_the_specifications(fixture_slm):
    """norm_eps < 1 and min_p < 1, exactly (docs/slm-format.md)."""
    expect("bad-field", mutated(fixture_slm, lambda p: p.manifest["architecture"].update(norm_eps=1.0)))
    expect("bad-field", mutated(fixture_slm, lambda p: p.manifest["generation"].update(min_p=1.0)))
    validate_bytes(mutated(fixture_slm, lambda p: p.manifest["generation"].update(min_p=0.9999995)))


def test_any_other_failure_is_malformed_and_stays(fixture_slm, monkeypatch):
    """A check that fails with something other than an ArtifactError (a bug, or a case no
    check foresaw) still ends in a code; the validator then refuses every further call."""
    from webslm.artifact import schema
    def broken_check(*args):
        return {}["top_p"]                  # a KeyError inside a check
    monkeypatch.setattr(schema, "generation", broken_check)
    validator = Validator()
    with pytest.raises(ArtifactError) as caught:
        validator.feed(fixture_slm)
    assert caught.value.code == "malformed" and "KeyError" in caught.value.sentence
    with pytest.raises(ArtifactError) as again:
        validator.finish()
    assert again.value is caught.value


def test_running_out_of_memory_is_a_code(fixture_slm, monkeypatch):
    def no_memory(self, file_length):
        raise MemoryError
    monkeypatch.setattr(Validator, "_buffer", no_memory)
    expect("out-of-memory", fixture_slm)


def test_every_code_has_a_case():
    """Keeps the corpus complete: a new code needs a case above."""
    source = open(__file__).read()
    missing = [code for code in CODES if f'"{code}"' not in source.split("def test_every_code_has_a_case")[0]]
    assert missing == []


def test_streaming_rejects_bad_table_before_the_payload_arrives(fixture_slm):
    bad = mutated(fixture_slm, lambda p: p.manifest["architecture"].update(n_heads=7))
    payload_offset = fmt.HEADER.unpack_from(bad)[7]
    validator = Validator()
    with pytest.raises(ArtifactError) as caught:
        validator.feed(bad[:payload_offset])
    assert caught.value.code in ("bad-architecture", "bad-shape")


def test_streaming_in_any_chunking_gives_the_same_identity(fixture_slm):
    whole = validate_bytes(fixture_slm).identity
    for size in (1, 7, 128, 4096, 65536):
        validator = Validator()
        for start in range(0, len(fixture_slm), size):
            validator.feed(fixture_slm[start:start + size])
        assert validator.finish().identity == whole


def test_open_model_gives_read_only_numpy_views_that_decode_like_dequantize(fixture_slm_path):
    import webslm
    model = webslm.open_model(fixture_slm_path)
    assert webslm.open_model(fixture_slm_path.read_bytes()).identity == model.identity
    for name, info in model.manifest.tensors.items():
        arrays = model.tensor_arrays(name)
        assert list(arrays) == [part for part, _, _ in info.parts]
        for array in arrays.values():
            assert not array.flags.writeable and array.shape[0] == info.rows
        if info.encoding == "q8":
            codes = arrays["codes"].astype(np.float32).reshape(info.rows, -1, info.quant.block_elements)
            values = (codes * arrays["scales"].astype(np.float32)[:, :, None]).reshape(info.rows, -1)[:, :info.cols]
            np.testing.assert_array_equal(values, model.dequantize(name))
    with pytest.raises(TypeError):
        model.manifest.tokenizer["tokens"] = ()          # the manifest is read-only
