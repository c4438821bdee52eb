"""Grammar to token mask: which tokens of a vocabulary may come next, given a byte-level
recognizer's state. JSON mode (json_grammar.py), JSON-schema mode (json_schema.py) and
grammar mode (gbnf.py) all mask through here.

A grammar is any object with
    step(state, byte) -> state | None     the state after one more byte (None: refused)
    accepting(state) -> bool              the text read so far is a whole answer: EOS may follow
    finished(state) -> bool               ... and nothing but EOS may follow
    in_string(state) -> bool              every PLAIN byte leaves the state as it is
    closing(state) -> int                 the fewest bytes that make the text a whole answer,
                                          over closing.SAFE bytes (closing.py states the rule)
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
  `allowed_within(state, left)` keeps the answer closable within the token limit: a token
  is allowed only if closing() after it is at most `left`, the tokens that may follow it.
  Every SAFE byte is a token of its own (checked: `closes`), so closing() counts tokens
  that surely suffice, and a state with closing() <= left + 1 always keeps a token (the
  first byte of a shortest completion, or EOS): an answer that starts with closing() within
  its limit ends whole, however the limit cuts it (answer.py refuses a limit below the
  initial state's closing() up front). The walk that makes a state's mask also records
  closing() after each allowed token; the tokens that do not lower it are kept with the
  mask, grouped by that value, since only they can be too many.
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

    def walk(self, step, state, ends: list | None = None) -> np.ndarray:
        """bool [vocab]: the tokens whose every byte `step` accepts, starting from `state`.
        ends: given a list, the state after each such token is appended, then the array of
        their ids, in the same order."""
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
                if ends is not None:
                    ends.append(current)
                k += 1
        mask = np.zeros(self.vocab, dtype=bool)
        mask[self.ids[ok]] = True
        if ends is not None:
            ends.append(self.ids[ok])
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
        self.single_bytes = frozenset(raw[0] for raw, _ in pieces if len(raw) == 1)

    def walk(self, step, state, plain_stays: bool = False, ends: list | None = None) -> np.ndarray:
        """bool [vocab]: the tokens `step` accepts from `state`. plain_stays: the caller knows
        that every PLAIN byte leaves `state` as it is (inside a string: the plain tokens are
        not walked, nor put in `ends`). ends: as SortedPieces.walk."""
        if not plain_stays:
            return self.every.walk(step, state, ends)
        mask = self.other.walk(step, state, ends)
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
        from .closing import SAFE
        self.pieces, self.grammar, self.vocab = pieces, grammar, pieces.vocab
        self._eos = np.zeros(self.vocab, dtype=bool)
        self._eos[[t for t in eos_ids if 0 <= t < self.vocab]] = True
        self._eos.flags.writeable = False
        # state -> (packed bool [vocab], ((closing after, packed tokens), ...) for those not lowering it)
        self._cache: OrderedDict = OrderedDict()
        self.closes = SAFE <= pieces.single_bytes

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

    def closing(self, state) -> int:
        """The fewest tokens (bytes, closing.py's rule) that make the text a whole answer."""
        return self.grammar.closing(state)

    def allowed(self, state) -> np.ndarray:
        """bool [vocab]: the tokens that may follow `state` (a fresh array, or EOS's read-only one)."""
        if self.grammar.finished(state):
            return self._eos
        return np.unpackbits(self._entry(state)[0], count=self.vocab).astype(bool)

    def allowed_within(self, state, left: int) -> np.ndarray:
        """allowed(state), less the tokens after which the answer could not be closed within
        `left` more tokens (module docstring). Unchanged when the tokenizer does not spell
        every SAFE byte alone (`closes` false: the rule does not hold)."""
        if self.grammar.finished(state):
            return self._eos
        packed, rising = self._entry(state)
        mask = np.unpackbits(packed, count=self.vocab).astype(bool)
        if not self.closes:
            return mask
        for after, tokens in rising:
            if after > left:
                mask &= ~np.unpackbits(tokens, count=self.vocab).astype(bool)
        return mask

    def _entry(self, state):
        entry = self._cache.get(state)
        if entry is None:
            entry = self._cache[state] = self._compute(state)
            if len(self._cache) > MAX_CACHED:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(state)
        return entry

    def _compute(self, state):
        ends: list = []
        stays = self.grammar.in_string(state)
        mask = self.pieces.walk(self.grammar.step, state, stays, ends)
        if self.grammar.accepting(state):
            mask |= self._eos
        now = self.grammar.closing(state)
        tokens = ends.pop()
        # the grammars intern their states, so the walk's 49152 end states are a few objects
        closings = {after: self.grammar.closing(after) for after in set(ends)}
        values = np.fromiter(map(closings.__getitem__, ends), dtype=np.float64, count=len(ends))
        if stays:                                # plain text leaves closing() where it is
            tokens = np.concatenate([tokens, self.pieces.plain_ids])
            values = np.concatenate([values, np.full(len(self.pieces.plain_ids), now, dtype=np.float64)])
        rising = []
        for value in np.unique(values[values >= now]).tolist():
            chosen = np.zeros(self.vocab, dtype=bool)
            chosen[tokens[values == value]] = True
            rising.append((value, np.packbits(chosen)))
        return np.packbits(mask), tuple(rising)
