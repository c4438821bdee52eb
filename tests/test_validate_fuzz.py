"""Differential fuzzing of the validator: 10,000 mutated files in CI, each judged twice.

The validator must accept a mutated file exactly when tests/slm_oracle.py (an independent
reading of docs/slm-format.md) finds it valid, refuse every other one with an ArtifactError
whose code is in CODES (never another exception), and a file it accepted must work in the
tokenizer, the decoder, the chat template and a CPU prefill (slm_differential.use).
So a validator that accepts too much fails here, and so does one that refuses too much.
The cases are seeded (batch n uses random.Random(n)): a failure names its batch and case.
bench/fuzz_validate.py runs 100,000.
"""
from __future__ import annotations

import collections
import random

import pytest

import slm_differential
import slm_oracle
from webslm.artifact import schema

BATCHES, CASES_PER_BATCH = 10, 1000


@pytest.mark.parametrize("batch", range(BATCHES))
def test_the_validator_accepts_exactly_what_the_specification_allows(fixture_slm, batch):
    rng = random.Random(batch)
    outcomes = collections.Counter()
    for case in range(CASES_PER_BATCH):
        result = slm_differential.run_case(rng, fixture_slm)
        assert result.good, f"batch {batch} case {case}: {result}"
        outcomes[result.outcome == "valid"] += 1
    # both sides of the verdict are exercised in every batch
    assert outcomes[True] >= CASES_PER_BATCH // 50 and outcomes[False] >= CASES_PER_BATCH // 2, outcomes


def test_the_oracle_accepts_the_fixture_and_refuses_the_corpus_defects(fixture_slm):
    assert slm_oracle.violation(fixture_slm) is None
    assert slm_oracle.violation(fixture_slm[:-1]) is not None
    assert slm_oracle.violation(fixture_slm + b"\0") is not None


def test_the_fuzz_catches_a_validator_that_accepts_too_much(fixture_slm, monkeypatch):
    """The test above can fail: with the generation section's checks switched off, mutated
    generation defaults are accepted and the oracle says they should not be."""
    monkeypatch.setattr(schema, "generation", lambda value, context_length: value)
    rng = random.Random(7)
    bad = [c for c in (slm_differential.run_case(rng, fixture_slm, use_accepted=False) for _ in range(600))
           if not c.good]
    assert bad and all(c.outcome == "valid" and c.verdict for c in bad), [str(c) for c in bad[:3]]
