"""tests/test_validate_fuzz.py's property on the new format parts: whatever the bytes, the
validator accepts or raises ArtifactError with a known code, never anything else. The bases
are the model of every q5 and super-block kind (tests/kquant_model.py) and the tiny Gemma 3
(tests/gemma3_model.py: family gemma3, pre-tokenizer gemma with added_tokens)."""
from __future__ import annotations

import functools
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import slm_surgery as surgery
from fuzz_helpers import json_value, outcome, paths, replace

pytest.importorskip("gguf")        # kquant_model splits GGUF blocks with the converter's code

FUZZ = settings(max_examples=800, derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow])


@functools.cache
def model_bytes(which: str) -> bytes:
    import gemma3_model
    import kquant_model
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/{which}.slm"
        (kquant_model.kquant_slm if which == "kquant" else gemma3_model.write)(path)
        with open(path, "rb") as handle:
            return handle.read()


@FUZZ
@given(data=st.data())
def test_kquant_table_mutations(data):
    pieces = surgery.split(model_bytes("kquant"))
    path = data.draw(st.sampled_from(sorted(paths(pieces.table), key=repr)))
    pieces.table = replace(pieces.table, path, data.draw(json_value))
    outcome(surgery.join(pieces, rehash=data.draw(st.booleans())))


@FUZZ
@given(data=st.data())
def test_kquant_payload_mutations(data):
    """Bytes changed anywhere in the parts (sub-scales, high bits, scales), tensors re-hashed."""
    pieces = surgery.split(model_bytes("kquant"))
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, len(pieces.payload) - 1))
        pieces.payload[at] = data.draw(st.sampled_from([0, 0x3F, 0x40, 0x7C, 0x7E, 0x80, 0xFC, 0xFF]))
    outcome(surgery.join(pieces))


@FUZZ
@given(data=st.data())
def test_gemma3_manifest_mutations(data):
    pieces = surgery.split(model_bytes("gemma3"))
    path = data.draw(st.sampled_from(sorted(paths(pieces.manifest), key=repr)))
    pieces.manifest = replace(pieces.manifest, path, data.draw(json_value))
    outcome(surgery.join(pieces))
