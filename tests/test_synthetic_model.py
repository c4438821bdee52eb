"""bench/synthetic_model.py: random-weight .slm artifacts of a given shape for speed benchmarks.
The tiny shape is written, validated by webslm's validator and run once on the CPU backend."""
from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import webslm
from webslm.cpu import CpuBackend

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "synthetic_model.py"


@pytest.fixture(scope="module")
def synthetic():
    spec = importlib.util.spec_from_file_location("synthetic_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny(synthetic, tmp_path_factory):
    path = tmp_path_factory.mktemp("synthetic") / "tiny.slm"
    digest = synthetic.write_synthetic(path, "tiny")
    return path, digest


def test_tiny_validates_with_the_stated_architecture(tiny):
    path, digest = tiny
    model = webslm.open_model(path)
    assert model.identity.artifact_sha256 == digest
    a = model.architecture
    assert (a.family, a.n_layers, a.n_heads, a.n_kv_heads, a.head_dim) == ("llama", 2, 4, 2, 12)
    assert (a.hidden, a.ffn, a.vocab, a.context_length) == (48, 80, 320, 64)
    assert a.tied_output and not a.qkv_bias
    assert (a.rope.convention, a.rope.rotary_dim, a.rope.scaling) == ("rotate-half", 12, None)
    tensors = model.manifest.tensors
    assert "output" not in tensors and len(tensors) == 2 + 9 * a.n_layers
    for name, info in tensors.items():
        if name == "token_embd":
            assert (info.encoding, info.quant.block_elements, info.quant.scale_type) == ("q8", 32, "f16")
        elif name.endswith("_norm"):
            assert info.encoding == "f32"
        else:
            q = info.quant
            assert (info.encoding, q.zero, q.block_elements, q.scale_type) == ("q4", "min", 32, "f16")
            assert q.blocks_per_row * q.block_elements > info.cols     # a partial last block: padding was zeroed


def test_tiny_runs_on_the_cpu_backend(tiny):
    model = webslm.open_model(tiny[0])
    logits = CpuBackend(model).prefill([1, 2, 3])
    assert logits.shape == (320,) and np.isfinite(logits).all()
    assert logits.std() > 0


def test_values_have_the_intended_scale(tiny):
    model = webslm.open_model(tiny[0])
    embedding = model.dequantize("token_embd")
    assert abs(embedding.std() / (2 / np.sqrt(48)) - 1) < 0.2
    for name, cols in (("blk.0.attn_q", 48), ("blk.1.ffn_down", 80)):
        w = model.dequantize(name)
        assert abs(w.mean()) < 0.2 / np.sqrt(cols)
        assert abs(w.std() / (1 / np.sqrt(cols)) - 1) < 0.2
    assert abs(model.dequantize("output_norm").mean() - 1) < 0.05


def test_every_id_has_a_token(tiny):
    model = webslm.open_model(tiny[0])
    tokens = model.manifest.tokenizer["tokens"]
    assert len(tokens) == model.architecture.vocab == len(set(tokens))
    text = model.tokenizer.decode(range(model.architecture.vocab))
    assert text.endswith(" aau")               # placeholders: "Ġ" + a pseudo-word each
    assert model.tokenizer.encode("the user") == model.tokenizer.encode("the user")   # the fixture's BPE still works


def test_deterministic_and_seeded(synthetic, tiny, tmp_path):
    assert synthetic.write_synthetic(tmp_path / "again.slm", "tiny") == tiny[1]
    assert (tmp_path / "again.slm").read_bytes() == tiny[0].read_bytes()
    assert synthetic.write_synthetic(tmp_path / "other.slm", "tiny", seed=7) != tiny[1]


def test_full_shapes_are_valid_architectures(synthetic):
    from webslm.artifact import schema
    for shape, (layers, hidden, vocab) in {"llama1b": (16, 2048, 128256), "smollm2": (30, 576, 49152)}.items():
        a = schema.architecture(synthetic.architecture(shape))
        assert (a.n_layers, a.hidden, a.vocab, a.tied_output) == (layers, hidden, vocab, True)
        assert len(schema.tokenizer(synthetic.tokenizer(vocab), vocab)["tokens"]) == vocab


def test_command_line(tmp_path):
    out = tmp_path / "cli.slm"
    result = subprocess.run([sys.executable, str(SCRIPT), "--shape", "tiny", "--out", str(out), "--validate"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "valid: 2 layers, vocab 320" in result.stdout
    assert webslm.open_model(out).architecture.vocab == 320
