"""The shape every typed webslm error shares: a stable code, where, and a sentence for people.

Each layer has its own subclass and code table (artifact, sampler, ledger); callers match
on `code`, show `sentence`, and point at `where`.
"""
from __future__ import annotations


class CodedError(ValueError):
    def __init__(self, code: str, where: str, sentence: str):
        super().__init__(f"{code} at {where}: {sentence}")
        self.code = code
        self.where = where
        self.sentence = sentence
