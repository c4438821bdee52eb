"""JSON mode: which tokens may come next so that the answer stays a prefix of one JSON object
(response_format {"type": "json_object"}), as a mask over the vocabulary.

Two parts:

- A byte-level recognizer for JSON text (RFC 8259) whose top-level value is an object:
  `step(state, byte)` is the state after one more byte, or None if no JSON object starts
  with what has been read. A state is a small tuple (the open containers, a mode, one
  integer), so it can be a dict key. Bytes >= 0x80 are taken as string content (UTF-8 is
  left to the tokenizer's decoder); whitespace runs are at most MAX_WHITESPACE bytes and
  nesting at most MAX_DEPTH, so a model cannot stall in blanks or recurse without end.
- `json_mask_for(tokenizer, vocab, eos_ids)`: token_mask.GrammarMask over this recognizer:
  `allowed(state)` is a bool [vocab] mask, cached per state. Special tokens are never
  allowed; the EOS ids are allowed exactly when the object is complete, and then nothing
  else is. `closing(state)` is the fewest bytes that complete the object (all ASCII), with
  which `allowed_within(state, left)` keeps the answer closable within the token limit, as
  it does for schemas and grammars (token_mask.py). So an answer cut by max_tokens is still
  a whole object (a limit below 2, no room for "{}", is refused up front: answer.py).

The mask is a function of the committed tokens only, so it is the same on the GPU and the
CPU, after a device loss's replay, and in every browser: the sampler's determinism holds.
"""
from __future__ import annotations

from functools import lru_cache

from .token_mask import GrammarMask, token_pieces

MAX_WHITESPACE = 24          # consecutive blanks between tokens of the JSON text
MAX_DEPTH = 32               # nested objects and arrays

# modes
START, VALUE, VALUE_OR_CLOSE, KEY_OR_CLOSE, KEY, COLON, AFTER, DONE, STRING, ESCAPE, HEX, NUMBER, LITERAL = range(13)
BLANK_MODES = frozenset({START, VALUE, VALUE_OR_CLOSE, KEY_OR_CLOSE, KEY, COLON, AFTER})
WHITESPACE = frozenset(b" \t\n\r")
DIGITS = frozenset(b"0123456789")
HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
ESCAPES = frozenset(b'"\\/bfnrt')
LITERALS = (b"true", b"false", b"null")
# NUMBER's sub-states: after "-", after a leading "0", in the integer, after ".", in the
# fraction, after "e", after the exponent's sign, in the exponent. A number may end in these:
NUMBER_ENDS = frozenset({1, 2, 4, 7})

# (open containers as a str of "{" and "[", mode, aux): aux is the blank run in BLANK_MODES,
# 1 for a key (0 for a value) in STRING and ESCAPE, key * 8 + hex digits left in HEX, the
# sub-state in NUMBER, literal * 8 + bytes read in LITERAL.
State = tuple[str, int, int]
INITIAL: State = ("", START, 0)


def _after_value(stack: str) -> State:
    return (stack, AFTER, 0) if stack else (stack, DONE, 0)


@lru_cache(maxsize=1 << 16)
def step(state: State, byte: int) -> State | None:
    """The recognizer's state after `byte`, or None when the text can no longer be a JSON object."""
    stack, mode, aux = state
    if mode in BLANK_MODES and byte in WHITESPACE:
        return (stack, mode, aux + 1) if aux < MAX_WHITESPACE else None
    if mode == START:
        return ("{", KEY_OR_CLOSE, 0) if byte == ord("{") else None
    if mode in (VALUE, VALUE_OR_CLOSE):
        if mode == VALUE_OR_CLOSE and byte == ord("]"):
            return _after_value(stack[:-1])
        return _value_start(stack, byte)
    if mode in (KEY_OR_CLOSE, KEY):
        if mode == KEY_OR_CLOSE and byte == ord("}"):
            return _after_value(stack[:-1])
        return (stack, STRING, 1) if byte == ord('"') else None
    if mode == COLON:
        return (stack, VALUE, 0) if byte == ord(":") else None
    if mode == AFTER:
        top = stack[-1]
        if byte == ord(","):
            return (stack, KEY, 0) if top == "{" else (stack, VALUE, 0)
        if byte == ord("}" if top == "{" else "]"):
            return _after_value(stack[:-1])
        return None
    if mode == STRING:
        if byte == ord('"'):
            return (stack, COLON, 0) if aux else _after_value(stack)
        if byte == ord("\\"):
            return (stack, ESCAPE, aux)
        return state if byte >= 0x20 else None          # control characters must be escaped
    if mode == ESCAPE:
        if byte == ord("u"):
            return (stack, HEX, aux * 8 + 4)
        return (stack, STRING, aux) if byte in ESCAPES else None
    if mode == HEX:
        if byte not in HEX_DIGITS:
            return None
        key, left = divmod(aux, 8)
        return (stack, STRING, key) if left == 1 else (stack, HEX, key * 8 + left - 1)
    if mode == NUMBER:
        after = _number(aux, byte)
        if after is not None:
            return (stack, NUMBER, after)
        return step(_after_value(stack), byte) if aux in NUMBER_ENDS else None
    if mode == LITERAL:
        which, read = divmod(aux, 8)
        literal = LITERALS[which]
        if byte != literal[read]:
            return None
        return _after_value(stack) if read + 1 == len(literal) else (stack, LITERAL, which * 8 + read + 1)
    return None                                          # DONE: nothing follows the object


def _value_start(stack: str, byte: int) -> State | None:
    if byte == ord('"'):
        return (stack, STRING, 0)
    if byte in (ord("{"), ord("[")):
        if len(stack) >= MAX_DEPTH:
            return None
        return (stack + chr(byte), KEY_OR_CLOSE if byte == ord("{") else VALUE_OR_CLOSE, 0)
    if byte == ord("-"):
        return (stack, NUMBER, 0)
    if byte in DIGITS:
        return (stack, NUMBER, 1 if byte == ord("0") else 2)
    for which, literal in enumerate(LITERALS):
        if byte == literal[0]:
            return (stack, LITERAL, which * 8 + 1)
    return None


def _number(sub: int, byte: int) -> int | None:
    """NUMBER's next sub-state, or None when `byte` does not continue the number."""
    digit = byte in DIGITS
    if sub == 0:
        return (1 if byte == ord("0") else 2) if digit else None
    if sub in (1, 2, 4) and byte in (ord("e"), ord("E")):
        return 5
    if sub in (1, 2) and byte == ord("."):
        return 3
    if sub == 2 and digit:
        return 2
    if sub in (3, 4) and digit:
        return 4
    if sub == 5 and byte in (ord("+"), ord("-")):
        return 6
    if sub in (5, 6, 7) and digit:
        return 7
    return None


def advance(state: State, data: bytes) -> State | None:
    for byte in data:
        state = step(state, byte)
        if state is None:
            return None
    return state


def closing(state: State) -> int:
    """The fewest bytes that complete the object from `state` ("0" for a value, '"":0' for a
    key, one byte per open container)."""
    stack, mode, aux = state
    opened = len(stack)
    if mode == START:
        return 2
    if mode in (DONE, AFTER, VALUE_OR_CLOSE, KEY_OR_CLOSE):
        return opened
    if mode == VALUE:
        return 1 + opened
    if mode == KEY:
        return 4 + opened
    if mode == COLON:
        return 2 + opened
    if mode == STRING:
        return (3 if aux else 1) + opened
    if mode == ESCAPE:
        return 1 + (3 if aux else 1) + opened
    if mode == HEX:
        key, left = divmod(aux, 8)
        return left + (3 if key else 1) + opened
    if mode == NUMBER:
        return opened if aux in NUMBER_ENDS else 1 + opened
    which, read = divmod(aux, 8)                          # LITERAL
    return len(LITERALS[which]) - read + opened


class ObjectGrammar:
    """The recognizer above as token_mask's grammar: a whole object ends the answer."""
    initial = INITIAL
    step = staticmethod(step)

    @staticmethod
    def accepting(state: State) -> bool:
        return state[1] == DONE

    finished = accepting

    @staticmethod
    def in_string(state: State) -> bool:
        return state[1] == STRING

    closing = staticmethod(closing)


def json_mask_for(tokenizer, vocab: int, eos_ids) -> GrammarMask:
    """The tokenizer's JSON-mode GrammarMask, made once and kept on the tokenizer (its sorted
    pieces and every mask computed so far are reused by every later answer)."""
    mask = getattr(tokenizer, "_json_mask", None)
    if mask is None or mask.vocab != vocab:
        mask = GrammarMask(token_pieces(tokenizer, vocab), ObjectGrammar, eos_ids)
        tokenizer._json_mask = mask
    return mask
