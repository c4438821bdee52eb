"""The fixture model (webslm.fixture): pinned bytes, every tensor kind, values within the codecs'
error bounds, a consistent tokenizer.

Reads the file with tests/slm_reading.py (independent of the validator) and with the validator.
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
import time

import numpy as np
import pytest

from webslm import fixture
from webslm.artifact import format as fmt

from slm_reading import Slm, assert_within_bound, read_slm

# Changes exactly when the fixture's bytes do (recipe, writer layout or codecs): update it on purpose.
FIXTURE_SHA256 = "c2894551242d44576d616a8761f0289d1ad800ac5e91bfcb0a8b02e0449a27a4"


# -- the fixture -----------------------------------------------------------------------------

def test_bytes_are_pinned_and_fast(tmp_path):
    start = time.perf_counter()
    digest = fixture.make_fixture(tmp_path / "a.slm")
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"fixture generation took {elapsed:.2f} s"
    assert digest == hashlib.sha256((tmp_path / "a.slm").read_bytes()[:-32]).hexdigest()
    assert digest == fixture.make_fixture(tmp_path / "b.slm")
    assert (tmp_path / "a.slm").read_bytes() == (tmp_path / "b.slm").read_bytes()
    assert digest == FIXTURE_SHA256


def test_command_line_writes_the_same_file(tmp_path):
    out = tmp_path / "cli.slm"
    result = subprocess.run([sys.executable, "-m", "webslm.fixture", str(out)],
                            capture_output=True, text=True, check=True)
    assert FIXTURE_SHA256 in result.stdout
    assert hashlib.sha256(out.read_bytes()[:-32]).hexdigest() == FIXTURE_SHA256


@pytest.fixture(scope="module")
def slm(tmp_path_factory) -> Slm:
    path = tmp_path_factory.mktemp("fixture") / "fixture.slm"
    fixture.make_fixture(path)
    return read_slm(path)


def test_architecture_is_the_documented_one(slm):
    a = slm.manifest["architecture"]
    assert (a["n_layers"], a["n_heads"], a["n_kv_heads"], a["head_dim"], a["hidden"], a["ffn"]) == (2, 4, 2, 12, 48, 72)
    assert (a["vocab"], a["context_length"], a["qkv_bias"], a["tied_output"]) == (300, 64, True, False)
    assert a["rope"] == {"base": 10000.0, "rotary_dim": 8, "convention": "adjacent-pair",
                         "position_offset": 0, "scaling": None}
    assert list(slm.entries) == list(fmt.required_tensors(a))
    for name, shape in fmt.required_tensors(a).items():
        assert tuple(slm.entries[name]["shape"]) == shape


def test_every_tensor_kind_block_size_and_scale_type(slm):
    quantized = {(e["encoding"], e["quant"]["zero"], e["quant"]["block_elements"], e["quant"]["scale_type"])
                 for e in slm.entries.values() if e["quant"]}
    for encoding, zero in (("q8", "none"), ("q4", "min"), ("q4", "offset")):
        for block in (32, 64):
            for scale_type in ("f16", "f32"):
                assert (encoding, zero, block, scale_type) in quantized
    floats = {(e["encoding"], len(e["shape"])) for e in slm.entries.values() if not e["quant"]}
    assert floats == {("f32", 1), ("f16", 1), ("f32", 2), ("f16", 2)}
    tails = {e["quant"]["tail_elements"] for e in slm.entries.values() if e["quant"]}
    assert tails == {8, 16, 48}, "every quantized row must end in a partial block"
    for name, (encoding, zero, block, scale_type) in fixture.ENCODINGS.items():
        e = slm.entries[name]
        assert e["encoding"] == encoding
        if e["quant"]:
            assert (e["quant"]["zero"], e["quant"]["block_elements"], e["quant"]["scale_type"]) == \
                ("none" if zero is None else zero, block, scale_type)


def test_values_are_within_the_codec_bounds(slm):
    weights = fixture.fixture_weights()
    for name, source in weights.items():
        assert np.abs(source).max() > 0 and np.unique(source).size > 1, f"{name} must not be degenerate"
        assert_within_bound(source.astype(np.float64), slm.entries[name], slm.parts[name])


def test_adversarial_rows_are_there():
    w = fixture.fixture_weights()["blk.0.ffn_gate"]
    peak = np.abs(w).max()
    assert np.unique(w[1]).size == 1 and w[1, 0] != 0                # constant
    assert np.unique(np.abs(w[2])).size == 1                          # one magnitude, both signs
    assert (np.sign(w[2]) > 0).any() and (np.sign(w[2]) < 0).any()
    assert (np.sign(w[3][::2]) > 0).all() and (np.sign(w[3][1::2]) < 0).all()
    assert np.argmax(np.abs(w[4])) == w.shape[1] - 1 and w[4, -1] == np.float32(peak)


def test_tokenizer_is_gpt2_byte_level(slm):
    t = slm.manifest["tokenizer"]
    tokens = t["tokens"]
    assert len(tokens) == 256 + len(fixture.MERGES) + 3 <= slm.manifest["architecture"]["vocab"]
    assert len(set(tokens)) == len(tokens)
    byte_map = fixture.bytes_to_unicode()
    assert sorted(map(ord, byte_map.values())) != list(range(256))   # not the identity: GPT-2's remap
    assert (byte_map[ord(" ")], byte_map[ord("\n")], byte_map[ord("A")]) == ("Ġ", "Ċ", "A")
    assert tokens[:256] == [byte_map[b] for b in range(256)]
    for merge in t["merges"]:
        left, right = merge.split(" ")
        assert tokens.index(left) < tokens.index(left + right) and tokens.index(right) < tokens.index(left + right)
    for special in t["special_tokens"]:
        assert tokens[special["id"]] == special["content"]
    assert [tokens[i] for i in t["eos_ids"]] == ["<|im_end|>", "<|endoftext|>"]
    assert (t["pre_tokenizer"], t["byte_level"], t["byte_fallback"], t["add_bos"]) == ("gpt2", True, False, False)


def test_chat_template_renders_chatml(slm):
    jinja2 = pytest.importorskip("jinja2")
    text = jinja2.Template(slm.manifest["chat_template"]["template"]).render(
        messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert slm.manifest["generation"] == fixture.GENERATION


def test_the_validator_accepts_it_with_the_same_identity(tmp_path):
    from webslm.artifact.validate import validate_file
    path = tmp_path / "fixture.slm"
    digest = fixture.make_fixture(path)
    model = validate_file(path)
    assert model.identity.artifact_sha256 == digest
    ours = read_slm(path)
    for name in ours.entries:
        np.testing.assert_array_equal(model.dequantize(name), ours.decode(name))
