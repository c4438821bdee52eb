"""The counter-based RNG (webslm.semantic.rng): Philox4x32-10 known answers from Random123,
the pinned (seed, position, stream) -> uniform mapping of docs/sampler.md, and its shape."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from webslm.semantic import rng

PROPS = settings(max_examples=300, derandomize=True, database=None, deadline=None)

# Random123's kat_vectors, the three philox4x32 10 lines: counter, key -> output.
RANDOM123_KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]

# Our layout on top of it (docs/sampler.md, "Known answers"): seed, position, stream ->
# the u64 x and the uniform (as float.hex, exact).
LAYOUT_KAT = [
    (0, 0, 0, 0xE169C58D6627E8D5, 0.8805201978886142),
    (42, 0, 0, 0x77F5493B9CEAF053, 0.4685865183391049),
    (42, 1, 0, 0x53BA6CFDFCDB2127, 0.32706338120338474),
    (42, 7, 0, 0x68784C855BBD83B1, 0.4080856156904158),
    (0xFFFFFFFFFFFFFFFF, 2**40 + 3, 0, 0x3E667DB9AD53EFF0, 0.24375139029628168),
    (0x0123456789ABCDEF, 1000, 0, 0xA487FECA3B167A1B, 0.6427001231887405),
]


@pytest.mark.parametrize("counter,key,expected", RANDOM123_KAT)
def test_philox_known_answers(counter, key, expected):
    assert rng.philox4x32_10(counter, key) == expected


@pytest.mark.parametrize("seed,position,stream,x,u", LAYOUT_KAT)
def test_layout_known_answers(seed, position, stream, x, u):
    assert rng.random_u64(seed, position, stream) == x
    assert rng.uniform(seed, position, stream) == u
    assert rng.uniform(seed, position, stream) == (x >> 11) / 2**53


def test_seed_position_and_stream_map_to_key_and_counter():
    seed, position = 0x0123456789ABCDEF, 0x0000_0005_0000_0009
    assert rng.random_words(seed, position, 3) == rng.philox4x32_10(
        (0x0000_0009, 0x0000_0005, 3, 0), (0x89ABCDEF, 0x01234567))


@PROPS
@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1))
def test_uniform_is_a_53_bit_fraction_in_unit_interval(seed, position, stream):
    u = rng.uniform(seed, position, stream)
    assert 0.0 <= u < 1.0
    assert (u * 2**53).is_integer()
    assert u == rng.uniform(seed, position, stream)


def test_neighbouring_counters_and_streams_differ():
    values = {rng.uniform(7, p, s) for p in range(200) for s in range(3)}
    assert len(values) == 600


def test_uniform_bins_chi_square():
    """16 equal bins over 16000 consecutive positions of one seed. Deterministic: the bound is
    chi-square(15)'s 0.999 quantile, a statement about the generator, not a flaky threshold."""
    n, bins = 16000, 16
    counts = [0] * bins
    for position in range(n):
        counts[int(rng.uniform(2024, position) * bins)] += 1
    expected = n / bins
    chi2 = sum((c - expected) ** 2 / expected for c in counts)
    assert chi2 < 37.697


@pytest.mark.parametrize("args", [(-1, 0), (2**64, 0), (0, -1), (0, 2**64), (True, 0), (0, 1.0),
                                  (0, 0, -1), (0, 0, 2**32), (0, 0, False)])
def test_bad_arguments_are_refused(args):
    with pytest.raises(ValueError):
        rng.uniform(*args)
