"""Hypothesis strategies and helpers for the mutation fuzz of new encodings and families
(tests/test_validate_fuzz_kquant_gemma3.py): a JSON value strategy, the validator outcome of
bytes (a code, or "valid"), every path into a JSON value, and a replace at a path."""
from __future__ import annotations

from hypothesis import strategies as st

from webslm.artifact import ArtifactError, Validator
from webslm.artifact.errors import CODES

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

