"""The request fields OpenAI and WebLLM add to the sampler: logit_bias, logprobs/top_logprobs
(docs/sampler.md, sections 3, 7 and 8, and "Log-probabilities").

Oracles: a bias is the same as adding it to the logits by hand (so the spec's own scalar
reference in test_sampler.py covers everything after it); logprobs against a float64
log-softmax written out here with numpy's exp and log. Equality is exact where the spec is
(choices, candidate sets, state hashes); logprobs are reported values, compared to 1e-12."""
from __future__ import annotations

import hashlib
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from webslm.backends.scores import Want
from webslm.engine.engine import want_for
from webslm.semantic.sampler import Sampler, SamplerError, SamplerSettings, canonical_top_k
from test_sampler import logits_strategy, settings_strategy

PROPS = settings(max_examples=300, derandomize=True, database=None, deadline=None, print_blob=False)
BIASES = [-math.inf, -100.0, -7.5, -0.25, 0.0, 0.5, 3.0, 100.0]


@st.composite
def biased_scenario(draw, lowering_only=False):
    logits = draw(logits_strategy(min_vocab=2))
    vocab = logits.size
    s = draw(settings_strategy(vocab))
    choices = [b for b in BIASES if b <= 0.0] if lowering_only else BIASES
    bias = draw(st.dictionaries(st.integers(0, vocab - 1), st.sampled_from(choices), max_size=4))
    history = draw(st.lists(st.integers(0, vocab - 1), max_size=8))
    return logits, replace(s, logit_bias=bias), history, draw(st.integers(0, 2**40))


def by_hand(logits, bias: dict) -> np.ndarray:
    """The logits with each bias added, in float64 (what the sampler does first)."""
    out = np.asarray(logits, np.float64).copy()
    for token, b in bias.items():
        out[token] = out[token] + b
    return out


@PROPS
@given(biased_scenario())
def test_a_bias_is_the_same_as_adding_it_to_the_logits(case):
    logits, s, history, position = case
    by_hand_logits = by_hand(logits, dict(s.logit_bias))
    assume(np.isfinite(by_hand_logits).any())
    plain = replace(s, logit_bias=())
    expected = Sampler(plain, logits.size, position=position, history=history).choose(by_hand_logits, position)
    got = Sampler(s, logits.size, position=position, history=history).choose(logits, position)
    assert got == expected


def test_a_banned_token_is_never_chosen_and_a_big_bias_wins():
    logits = np.array([5.0, 4.0, 3.0, -1.0])
    greedy = SamplerSettings(temperature=0.0)
    assert Sampler(greedy, 4).choose(logits, 0) == 0
    assert Sampler(replace(greedy, logit_bias={0: -math.inf}), 4).choose(logits, 0) == 1
    assert Sampler(replace(greedy, logit_bias={3: 100.0}), 4).choose(logits, 0) == 3
    hot = SamplerSettings(temperature=50.0, logit_bias={1: -math.inf, 2: -math.inf})
    assert {Sampler(hot, 4, position=p).choose(logits, p) for p in range(200)} == {0, 3}
    with pytest.raises(SamplerError) as err:
        Sampler(replace(greedy, logit_bias={t: -math.inf for t in range(4)}), 4).choose(logits, 0)
    assert err.value.code == "no-token"


@PROPS
@given(biased_scenario(), st.integers(1, 26))
def test_candidates_with_a_bias_equal_the_full_row_whenever_allowed(case, k):
    logits, s, history, position = case
    full = Sampler(s, logits.size, position=position, history=history)
    try:
        expected = full.choose(logits, position)
    except SamplerError as err:
        assume(err.code != "no-token")
        raise
    ids = canonical_top_k(logits, k)[::-1]
    try:
        got = full.choose_from_candidates(ids, logits[ids], position)
    except SamplerError as err:
        assert err.code in ("candidates-insufficient", "no-token")
        assert err.code == "no-token" or full.needs_full_logits(k), "the rule allowed candidates then refused"
        return
    assert got == expected


@PROPS
@given(biased_scenario(lowering_only=True))
def test_lowering_biases_still_let_the_top_k_decide(case):
    logits, s, history, position = case
    s = replace(s, top_k=max(1, min(s.top_k, 3)), repetition_penalty=1.0, frequency_penalty=0.0,
                presence_penalty=0.0)
    sampler = Sampler(s, logits.size, position=position, history=history)
    need = 1 if s.greedy else s.top_k
    k = min(logits.size, need + len(s.logit_bias))
    assert not sampler.needs_full_logits(k)
    ids = canonical_top_k(logits, k)
    try:
        expected = sampler.choose(logits, position)
    except SamplerError as err:
        assert err.code == "no-token"
        return
    assert sampler.choose_from_candidates(ids, logits[ids], position) == expected


def test_a_raising_bias_outside_the_candidates_is_refused():
    s = SamplerSettings(temperature=0.0, logit_bias={3: 10.0})
    sampler = Sampler(s, 4)
    logits = np.array([4.0, 3.0, 2.0, 1.0])
    assert sampler.choose(logits, 0) == 3
    assert sampler.needs_full_logits(3)                   # a raise may come from anywhere
    with pytest.raises(SamplerError) as err:
        sampler.choose_from_candidates([0, 1], logits[[0, 1]], 0)
    assert err.value.code == "candidates-insufficient"
    assert sampler.choose_from_candidates([0, 3], logits[[0, 3]], 0) == 3


def test_the_engine_asks_the_backend_for_what_the_fields_need():
    greedy = SamplerSettings(temperature=0.0)
    assert want_for(Sampler(greedy, 1000)) == Want("argmax")
    # a bias can overturn the argmax: candidates (all lowering) or the full row (a raise)
    assert want_for(Sampler(replace(greedy, logit_bias={5: -100.0}), 1000)) == Want("top-k", 64)
    assert want_for(Sampler(replace(greedy, logit_bias={5: 1.0}), 1000)) == Want("full")
    # logprobs: the softmax's normalizer runs over every token
    assert want_for(Sampler(replace(greedy, logprobs=True), 1000)) == Want("full")
    assert want_for(Sampler(SamplerSettings(top_k=40, logprobs=True, top_logprobs=5), 1000)) == Want("full")
    assert want_for(Sampler(SamplerSettings(top_k=40, presence_penalty=0.5), 1000, history=[1, 2])) \
        == Want("top-k", 64)


# -- settings and the state hash ------------------------------------------------------------------

@pytest.mark.parametrize("changes, code, where", [
    ({"logit_bias": {1: 101.0}}, "out-of-range", "logit_bias[1]"),
    ({"logit_bias": {1: math.inf}}, "not-finite", "logit_bias[1]"),
    ({"logit_bias": {1: math.nan}}, "not-finite", "logit_bias[1]"),
    ({"logit_bias": {1: True}}, "bad-type", "logit_bias[1]"),
    ({"logit_bias": {-1: 1.0}}, "out-of-range", "logit_bias token id"),
    ({"logit_bias": {"1": 1.0}}, "bad-type", "logit_bias token id"),
    ({"logit_bias": [(1, 1.0), (1, 2.0)]}, "out-of-range", "logit_bias"),
    ({"logit_bias": "1:5"}, "bad-type", "logit_bias"),
    ({"logit_bias": {i: 1.0 for i in range(4097)}}, "out-of-range", "logit_bias"),
    ({"logprobs": 1}, "bad-type", "logprobs"),
    ({"top_logprobs": 3}, "out-of-range", "top_logprobs"),          # needs logprobs
    ({"logprobs": True, "top_logprobs": 21}, "out-of-range", "top_logprobs"),
])
def test_bad_values_are_refused_with_a_typed_error(changes, code, where):
    with pytest.raises(SamplerError) as err:
        SamplerSettings(**changes)
    assert (err.value.code, err.value.where) == (code, where)


def test_a_bias_is_stored_sorted_and_an_id_past_the_vocabulary_is_refused():
    s = SamplerSettings(logit_bias={9: 1, 2: -0.0})
    assert s.logit_bias == ((2, 0.0), (9, 1.0))
    assert s == SamplerSettings(logit_bias=[(2, 0.0), (9, 1.0)])
    with pytest.raises(SamplerError) as err:
        Sampler(s, 9)
    assert err.value.code == "bad-token"


def test_the_state_hash_keeps_its_first_format_unless_a_new_field_is_on():
    s = SamplerSettings(temperature=0.5, seed=3)
    first = Sampler(s, 16, history=[1, 2]).state_hash()
    assert not s.extended
    variants = [replace(s, logit_bias={4: -1.0}), replace(s, logit_bias={4: -2.0}),
                replace(s, logit_bias={5: -1.0}), replace(s, logit_bias={4: -math.inf}),
                replace(s, logprobs=True), replace(s, logprobs=True, top_logprobs=2),
                replace(s, response_format="json_object")]
    hashes = {Sampler(v, 16, history=[1, 2]).state_hash() for v in variants}
    assert first not in hashes and len(hashes) == len(variants)
    # the second format, rebuilt from docs/sampler.md 8
    import struct
    v = replace(s, logit_bias={4: -1.0}, logprobs=True, top_logprobs=2)
    head = (b"WSLMSMP2" + struct.pack(">dIddddd", v.temperature, v.top_k, v.top_p, v.min_p,
                                      v.repetition_penalty, v.frequency_penalty, v.presence_penalty)
            + struct.pack(">IIQI", v.penalty_window, v.max_tokens, v.seed, 0)
            + struct.pack(">I", 1) + struct.pack(">Id", 4, -1.0) + struct.pack(">BIB", 1, 2, 0)
            + struct.pack(">I", 16))
    body = struct.pack(">II", 1, 2) + struct.pack(">QQ", 2, 2)
    assert Sampler(v, 16, history=[1, 2]).state_hash() == hashlib.sha256(head + body).hexdigest()


# -- logprobs -------------------------------------------------------------------------------------

def oracle_logprobs(logits, s: SamplerSettings, history) -> np.ndarray:
    """log-softmax of the biased, penalized logits at temperature T (1 when greedy), in plain
    float64 numpy (libm exp and log): the definition Sampler.logprobs implements."""
    values = by_hand(logits, dict(s.logit_bias))
    window = history[-s.penalty_window:] if s.penalty_window else list(history)
    for token in set(window):
        v = values[token]
        if s.repetition_penalty != 1.0:
            v = v / s.repetition_penalty if v > 0 else v * s.repetition_penalty
        v = v - (window.count(token) * s.frequency_penalty + s.presence_penalty)
        values[token] = v
    z = (values - values[np.isfinite(values)].max()) / (s.temperature or 1.0)
    return z - np.log(np.exp(z).sum())


@PROPS
@given(biased_scenario(), st.integers(0, 20))
def test_logprobs_are_the_log_softmax_of_what_the_sampler_chose_from(case, top):
    logits, s, history, _ = case
    s = replace(s, logprobs=True, top_logprobs=top)
    assume(s.temperature == 0.0 or s.temperature >= 0.05)     # no underflow games in the oracle
    assume(np.isfinite(by_hand(logits, dict(s.logit_bias))).any())
    sampler = Sampler(s, logits.size, history=history)
    expected = oracle_logprobs(logits, s, history)
    token = sampler.choose(logits, sampler.position)
    logprob, alternatives = sampler.logprobs(logits, token, top)
    assert logprob == pytest.approx(expected[token], abs=1e-12, rel=1e-12)
    assert logprob <= 1e-15
    finite = np.isfinite(expected)
    assert len(alternatives) == min(top, int(finite.sum()))
    ranked = sorted(np.flatnonzero(finite), key=lambda t: (-expected[t], t))
    # the order is the rank order: the oracle's, except where two values tie within rounding
    for (t, lp), want in zip(alternatives, ranked):
        assert lp == pytest.approx(expected[want], abs=1e-12, rel=1e-12)
        assert lp == pytest.approx(expected[t], abs=1e-12, rel=1e-12)
    assert [lp for _, lp in alternatives] == sorted((lp for _, lp in alternatives), reverse=True)


def test_logprobs_sum_to_one_and_greedy_reports_temperature_one():
    rng = np.random.default_rng(7)
    logits = rng.normal(0, 3, 500).astype(np.float32)
    greedy = Sampler(SamplerSettings(temperature=0.0, logprobs=True), 500)
    everything = [greedy.logprobs(logits, t)[0] for t in range(500)]
    assert math.fsum(math.exp(x) for x in everything) == pytest.approx(1.0, abs=1e-12)
    warm = Sampler(SamplerSettings(temperature=1.0, logprobs=True), 500)
    assert greedy.logprobs(logits, 3)[0] == warm.logprobs(logits, 3)[0]
    cold = Sampler(SamplerSettings(temperature=0.5, logprobs=True), 500)
    best = int(np.argmax(logits))
    assert cold.logprobs(logits, best)[0] > warm.logprobs(logits, best)[0]   # sharper at T < 1


def test_logprobs_see_the_history_before_the_commit():
    s = SamplerSettings(temperature=1.0, presence_penalty=2.0, logprobs=True, top_logprobs=1)
    sampler = Sampler(s, 3)
    logits = np.array([1.0, 0.0, -1.0], np.float32)
    before, top = sampler.logprobs(logits, 0, 1)
    assert top[0][0] == 0
    sampler.commit(0)                                    # now token 0 is penalized by 2
    after, top = sampler.logprobs(logits, 0, 1)
    assert after < before and top[0][0] == 1
