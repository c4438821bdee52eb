"""Property-based fuzzing of the validator: mutated headers, JSON sections and payloads.

The property: whatever the bytes, validation either succeeds or raises ArtifactError with a
known code. Any other exception (IndexError, KeyError, MemoryError, struct.error, ...) is a
bug. 10,000+ cases run in CI (derandomized, so a failure reproduces)."""
from __future__ import annotations

import functools
import tempfile

from hypothesis import HealthCheck, given, settings, strategies as st

from webslm.artifact import ArtifactError, Validator
from webslm.artifact.errors import CODES

import slm_surgery as surgery

FUZZ = settings(max_examples=2500, derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow])


@functools.cache
def fixture_bytes() -> bytes:
    """The valid fixture model (not a pytest fixture: hypothesis would print its bytes)."""
    from webslm.fixture import make_fixture
    with tempfile.TemporaryDirectory() as tmp:
        make_fixture(f"{tmp}/fixture.slm")
        with open(f"{tmp}/fixture.slm", "rb") as handle:
            return handle.read()

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
                      st.text(max_size=8), st.sampled_from([0, 1, -1, 2**24, 2**32, 2**63, 255, 256, "f16", "q4", "min"]))
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                          max_leaves=6)


def outcome(data: bytes, chunk: int = 0) -> str:
    validator = Validator()
    try:
        if chunk:
            for start in range(0, len(data), chunk):
                validator.feed(data[start:start + chunk])
        else:
            validator.feed(data)
        validator.finish()
        return "valid"
    except ArtifactError as exc:
        assert exc.code in CODES
        return exc.code


def paths(value, prefix=()):
    """Every path into a JSON value (dict keys and list indexes)."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from paths(child, prefix + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value[:4]):     # the first few elements of long lists
            yield from paths(child, prefix + (index,))


def replace(root, path, value):
    if not path:
        return value
    target = root
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return root


@FUZZ
@given(data=st.data())
def test_byte_mutations(data):
    blob = bytearray(fixture_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        # most flips land in the header, manifest and table, where parsing happens
        limit = data.draw(st.sampled_from([128, 4096, len(blob)]))
        blob[data.draw(st.integers(0, min(limit, len(blob)) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        blob = bytearray(surgery.retrailer(blob))      # so the defect is met past the file hash
    if data.draw(st.booleans()):
        blob = blob[:data.draw(st.integers(0, len(blob)))]
    outcome(bytes(blob), chunk=data.draw(st.sampled_from([0, 1000, 65536])))


@FUZZ
@given(data=st.data())
def test_manifest_mutations(data):
    pieces = surgery.split(fixture_bytes())
    path = data.draw(st.sampled_from(sorted(paths(pieces.manifest), key=repr)))
    pieces.manifest = replace(pieces.manifest, path, data.draw(json_value))
    outcome(surgery.join(pieces))


@FUZZ
@given(data=st.data())
def test_table_mutations(data):
    pieces = surgery.split(fixture_bytes())
    path = data.draw(st.sampled_from(sorted(paths(pieces.table), key=repr)))
    pieces.table = replace(pieces.table, path, data.draw(json_value))
    outcome(surgery.join(pieces, rehash=data.draw(st.booleans())))


@FUZZ
@given(data=st.data())
def test_header_field_mutations(data):
    pieces = surgery.split(fixture_bytes())
    field = data.draw(st.sampled_from(["version", "header_length", "manifest_offset", "manifest_length", "table_offset",
                                       "table_length", "payload_offset", "payload_length", "file_length",
                                       "payload_alignment"]))
    width = 4 if field in ("version", "header_length", "payload_alignment") else 8
    value = data.draw(st.one_of(st.integers(0, 2 ** (8 * width) - 1), st.integers(0, 4096)))
    outcome(surgery.join(pieces, header={field: value}))
