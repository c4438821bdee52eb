"""Grammar to token mask: which tokens of a vocabulary may come next, given a byte-level
recognizer's state. JSON mode (json_grammar.py) and JSON-schema mode (json_schema.py) both
mask through here.

A grammar is any object with
    step(state, byte) -> state | None     the state after one more byte (None: refused)
    accepting(state) -> bool              the text read so far is a whole answer: EOS may follow
    finished(state) -> bool               ... and nothing but EOS may follow
    in_string(state) -> bool              every PLAIN byte leaves the state as it is
States must be hashable: masks are cached per state.

- `TokenPieces(tokenizer, vocab)`: made once per tokenizer. Every token's bytes, sorted, with
  the length each shares with the one before it (special tokens and tokens without bytes
  left out: a grammar never allows them). `walk(step, state)` tries every token from
  `state` in sorted order, sharing the work of common prefixes: the states after the shared
  bytes are kept on a stack, and a prefix that fails sends the walk past every token that
  starts with it (a binary search). That is about one step per live trie node, not per
  byte or per token. Inside a string, the tokens of plain text are allowed as a block.
- `GrammarMask(pieces, grammar, eos_ids)`: allowed(state) -> bool [vocab], cached per state
  (packed to bits; at most MAX_CACHED states, the oldest dropped first). EOS is allowed
  exactly when the state is accepting; a finished state allows EOS only.
"""
from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict

import numpy as np

MAX_CACHED = 1024          # masks kept per grammar: 49152 tokens packed are 6 KiB each


# String text: the bytes a JSON string takes as they are (not '"', not '\\', no control byte).
PLAIN = frozenset(range(0x20, 0x100)) - {ord('"'), ord("\\")}


class SortedPieces:
    """Token byte strings in sorted order, each with the length it shares with the one before."""

    def __init__(self, pieces: list[tuple[bytes, int]], vocab: int):
        pieces = sorted(pieces)
        self.vocab = vocab
        self.bytes = [raw for raw, _ in pieces]
        self.ids = np.array([token for _, token in pieces], dtype=np.int64)
        self.shared = [0] + [_common_prefix(a, b) for a, b in zip(self.bytes, self.bytes[1:])]

    def walk(self, step, state) -> np.ndarray:
        """bool [vocab]: the tokens whose every byte `step` accepts, starting from `state`."""
        ok = np.zeros(len(self.bytes), dtype=bool)
        states = [state]              # states[d]: after the first d bytes of the token at hand
        k, n = 0, len(self.bytes)
        while k < n:
            raw, shared = self.bytes[k], self.shared[k]
            del states[shared + 1:]   # the states of the bytes this token shares with the last one tried
            current = states[shared]
            for depth in range(shared, len(raw)):
                current = step(current, raw[depth])
                if current is None:   # refused: skip every token that starts with raw[:depth + 1]
                    k = _skip(self.bytes, raw[:depth + 1], k + 1)
                    break
                states.append(current)
            else:
                ok[k] = True
                k += 1
        mask = np.zeros(self.vocab, dtype=bool)
        mask[self.ids[ok]] = True
        return mask


def _skip(pieces: list[bytes], prefix: bytes, start: int) -> int:
    """The index of the first piece from `start` on that does not start with `prefix`: the
    first one not below the least string greater than all that start with it (b"\\xff"
    bytes carry: after b"a\\xff..." comes b"b"; a prefix of only b"\\xff" bytes: the end)."""
    prefix = prefix.rstrip(b"\xff")
    if not prefix:
        return len(pieces)
    return bisect_left(pieces, prefix[:-1] + bytes([prefix[-1] + 1]), start)


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class TokenPieces:
    """A tokenizer's token bytes, sorted for sharing prefixes (module docstring). `plain_ids`:
    the tokens made of PLAIN bytes only; `other`: the rest, sorted on their own. Inside a
    JSON string every plain token leaves the recognizer where it was, so a string's mask is
    the plain tokens plus a walk over `other` (a few thousand tokens, not 49152)."""

    def __init__(self, tokenizer, vocab: int):
        pieces = []
        for token in range(min(vocab, len(tokenizer.tokens))):
            raw = tokenizer.piece_bytes(token)
            if raw and token not in tokenizer.special_ids:
                pieces.append((raw, token))
        self.vocab = vocab
        self.every = SortedPieces(pieces, vocab)
        self.plain_ids = np.array([t for raw, t in pieces if PLAIN.issuperset(raw)], dtype=np.int64)
        self.other = SortedPieces([(raw, t) for raw, t in pieces if not PLAIN.issuperset(raw)], vocab)

    def walk(self, step, state, plain_stays: bool = False) -> np.ndarray:
        """bool [vocab]: the tokens `step` accepts from `state`. plain_stays: the caller knows
        that every PLAIN byte leaves `state` as it is (inside a string)."""
        if not plain_stays:
            return self.every.walk(step, state)
        mask = self.other.walk(step, state)
        mask[self.plain_ids] = True
        return mask


def token_pieces(tokenizer, vocab: int) -> TokenPieces:
    """The tokenizer's TokenPieces, sorted once and kept on the tokenizer."""
    pieces = getattr(tokenizer, "_token_pieces", None)
    if pieces is None or pieces.vocab != vocab:
        pieces = TokenPieces(tokenizer, vocab)
        tokenizer._token_pieces = pieces
    return pieces


def kept_mask(tokenizer, kind: str, text: str, vocab: int, eos_ids, compile, keep: int) -> "GrammarMask":
    """The GrammarMask of `text` (a schema's canonical text, a grammar) compiled by `compile`
    on this tokenizer, kept on the tokenizer while it is among the `keep` of its `kind` used
    last (an app asks with the same schema or grammar again and again); the sorted token
    pieces are shared by every mask."""
    kept = getattr(tokenizer, f"_{kind}_masks", None)
    if kept is None:
        kept = {}
        setattr(tokenizer, f"_{kind}_masks", kept)
    key = (text, vocab, tuple(eos_ids))
    mask = kept.pop(key, None)
    if mask is None:
        mask = GrammarMask(token_pieces(tokenizer, vocab), compile(text), eos_ids)
    kept[key] = mask                        # re-inserted: the dict's order is the use order
    while len(kept) > keep:
        kept.pop(next(iter(kept)))
    return mask


class GrammarMask:
    """The tokens that keep the text in `grammar`'s language, per state (module docstring)."""

    def __init__(self, pieces: TokenPieces, grammar, eos_ids):
        self.pieces, self.grammar, self.vocab = pieces, grammar, pieces.vocab
        self._eos = np.zeros(self.vocab, dtype=bool)
        self._eos[[t for t in eos_ids if 0 <= t < self.vocab]] = True
        self._eos.flags.writeable = False
        self._cache: OrderedDict = OrderedDict()     # state -> packed bool [vocab]

    @property
    def initial(self):
        return self.grammar.initial

    def advance(self, state, data: bytes):
        """The state after `data`, or None if the grammar refuses it."""
        for byte in data:
            state = self.grammar.step(state, byte)
            if state is None:
                return None
        return state

    def allowed(self, state) -> np.ndarray:
        """bool [vocab]: the tokens that may follow `state` (a fresh array, or EOS's read-only one)."""
        if self.grammar.finished(state):
            return self._eos
        packed = self._cache.get(state)
        if packed is None:
            mask = self.pieces.walk(self.grammar.step, state, self.grammar.in_string(state))
            if self.grammar.accepting(state):
                mask |= self._eos
            packed = self._cache[state] = np.packbits(mask)
            if len(self._cache) > MAX_CACHED:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(state)
        return np.unpackbits(packed, count=self.vocab).astype(bool)
