"""One differential fuzz case: a mutated file, the validator's outcome and the oracle's verdict.

Used by tests/test_validate_fuzz.py (10,000 cases in CI) and bench/fuzz_validate.py (100,000).
A case is good when the validator accepts exactly the files tests/slm_oracle.py finds valid,
refuses every other one with an ArtifactError whose code is in CODES, and a file it accepted
can then be used: tokenizer, stream decoder, chat template (a TemplateError is a typed
refusal of the template, fine), and one token of a CPU answer.
"""
from __future__ import annotations

import dataclasses
import random

import slm_mutate
import slm_oracle
from webslm.artifact import ArtifactError, Validator
from webslm.artifact.errors import CODES


@dataclasses.dataclass
class Case:
    kind: str             # the mutation (slm_mutate.KINDS)
    feed: str             # how the bytes reached the validator
    verdict: str | None   # the oracle's: None when valid, else the rule broken
    outcome: str          # "valid", an ArtifactError code, or "untyped: ..." / "crash after accepting: ..."

    @property
    def good(self) -> bool:
        if self.outcome == "valid":
            return self.verdict is None
        return self.outcome in CODES and self.verdict is not None

    def __str__(self) -> str:
        return f"{self.kind} mutation fed as {self.feed}: validator {self.outcome!r}, oracle {self.verdict or 'valid'!r}"


def run_case(rng: random.Random, base: bytes, use_accepted: bool = True) -> Case:
    kind, data = slm_mutate.mutate(rng, base)
    feed = rng.choice(["bytes", "stream, size known", "stream, size unknown"])
    verdict = slm_oracle.violation(data)
    try:
        model = validate(data, feed, rng)
    except ArtifactError as exc:
        return Case(kind, feed, verdict, exc.code)
    except Exception as exc:    # noqa: BLE001 - what the differential counts
        return Case(kind, feed, verdict, f"untyped: {type(exc).__name__}: {str(exc)[:120]}")
    if use_accepted:
        try:
            use(model)
        except Exception as exc:    # noqa: BLE001
            return Case(kind, feed, verdict, f"crash after accepting: {type(exc).__name__}: {str(exc)[:120]}")
    return Case(kind, feed, verdict, "valid")


def validate(data: bytes, feed: str, rng: random.Random):
    if feed == "bytes":
        from webslm.artifact import validate_bytes
        return validate_bytes(data)
    validator = Validator(expected_bytes=len(data) if feed == "stream, size known" else None)
    chunk = rng.choice([1000, 4096, 65536])
    for start in range(0, len(data), chunk):
        validator.feed(data[start:start + chunk])
    return validator.finish()


def use(artifact) -> None:
    """What the page does with an accepted model, in small."""
    from webslm.cpu import CpuBackend
    from webslm.model import Model
    from webslm.semantic.chat_template import TemplateError
    model = Model(artifact)
    tokenizer = model.tokenizer
    specials = "".join(tokenizer.tokens[i] for i in sorted(tokenizer.special_ids))
    ids = tokenizer.encode("Hello, world! 12 é \U0001f600 " + specials)
    tokenizer.decode(range(model.architecture.vocab))
    try:
        model.chat_template.render([{"role": "user", "content": "Hi"}])
    except TemplateError:
        pass
    import numpy as np
    with np.errstate(all="ignore"):         # mutated weights may overflow: that is their business
        CpuBackend(model).prefill((ids or [0])[:model.architecture.context_length])
