"""Grammar mode (response_format {type: "grammar", grammar: GBNF}, semantic/gbnf.py): every
generated text is in the grammar's language, checked by recognizers that share nothing with
the generator: for the regular grammars a Python `re` pattern written by hand next to each
grammar, for the recursive one Python's own expression parser (ast) plus a character check.

- Random byte walks over what the recognizer takes never get stuck and always end in a text
  the oracle takes; texts the oracle's regex generates (hypothesis) are taken whole.
- Bad grammars are refused before generation with code "bad-grammar", naming the line and
  column or the rule; untrusted-size limits hold.
- The mask equals a brute-force check of every SmolLM2 token; SmolLM2's answers end "stop"
  and are in the language; the grammar is part of the sampler's state hash.
"""
from __future__ import annotations

import ast
import pathlib
import random
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import webslm
from webslm.cpu import CpuBackend
from webslm.generate import generate
from webslm.request import prompt_ids, sampler_settings
from webslm.semantic import gbnf
from webslm.semantic.gbnf import GrammarError, compile_grammar, grammar_mask_for
from webslm.semantic.sampler import Sampler

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"
needs_smollm2 = pytest.mark.skipif(not SMOLLM2.is_file(), reason="SmolLM2 is built by set-up (tools/assets.py)")
PROPS = settings(max_examples=200, derandomize=True, database=None, deadline=None, print_blob=False)

# (name, GBNF, an equivalent Python regex written by hand)
REGULAR = [
    ("answer", r'''
root   ::= "The answer is " answer "."   # yes, no or a number
answer ::= ("yes" | "no") | num
num    ::= [1-9] [0-9]{0,2}
''', r"The answer is (yes|no|[1-9][0-9]{0,2})\."),
    ("list", '''root ::= list
list ::= item ("," list)?
item ::= "a" | "bb" | [x-z]
''', r"(a|bb|[x-z])(,(a|bb|[x-z]))*"),
    ("quote", 'root ::= "\\u00ab" [^\\u00bb\\n]{1,5} "\\u00bb\\n"', "\u00ab[^\u00bb\n]{1,5}\u00bb\n"),
    ("csv", r'''root ::= row ("\n" row){0,2}
row  ::= cell ("," cell)*
cell ::= [a-z0-9]+ | "\"" [^"\n]* "\""
''', r'([a-z0-9]+|"[^"\n]*")(,([a-z0-9]+|"[^"\n]*"))*(\n([a-z0-9]+|"[^"\n]*")(,([a-z0-9]+|"[^"\n]*"))*){0,2}'),
    ("kv", '''root ::= pair+
pair ::= key "=" value ";"?
key ::= [a-zA-Z_] [a-zA-Z0-9_]*
value ::= "true" | "false" | "-"? [0-9]+
''', r"([a-zA-Z_][a-zA-Z0-9_]*=(true|false|-?[0-9]+);?)+"),
    ("any", 'root ::= "<" .{2,4} ">"', r"<(.|\n){2,4}>"),
]
ARITHMETIC = r'''
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor ("*" factor)*
factor ::= "0" | [1-9] [0-9]{0,2} | "(" expr ")"
'''


def in_arithmetic(text: str) -> bool:
    """Python's parser as the oracle: digits, + - * and parentheses, no unary minus."""
    if not re.fullmatch(r"[0-9+\-*()]+", text):
        return False
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    return all(isinstance(n, (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult)) for n in ast.walk(tree)) \
        and all(len(m) <= 3 for m in re.findall(r"[0-9]+", text))


def taken(grammar, text: str) -> bool:
    state = grammar.advance(grammar.initial, text.encode("utf-8"))
    return state is not None and grammar.accepting(state)


def walk(grammar, rng: random.Random, soft_limit: int = 60) -> str:
    """A random text the recognizer takes whole: any byte it takes (ASCII, some UTF-8)."""
    state, out = grammar.initial, bytearray()
    choices = list(range(0x0A, 0x7F)) + [0xC2, 0xAB, 0xBB, 0xC3, 0xA9, 0xE2, 0x82, 0xAC]
    while not grammar.finished(state):
        if grammar.accepting(state) and (rng.random() < 0.15 or len(out) > soft_limit):
            break
        options = [b for b in choices if grammar.step(state, b) is not None] or \
            [b for b in range(256) if grammar.step(state, b) is not None]
        assert options or grammar.accepting(state), f"stuck after {bytes(out)!r}"
        if not options:
            break
        if len(out) > soft_limit:                 # steer towards an end: prefer closers and separators
            closers = [b for b in options if b in b'.)>"\n;\xbb']
            options = closers or options
        byte = rng.choice(options)
        out.append(byte)
        state = grammar.step(state, byte)
    assert grammar.accepting(state)
    return out.decode("utf-8")


@pytest.mark.parametrize("n", range(len(REGULAR)), ids=[g[0] for g in REGULAR])
def test_random_walks_end_in_the_language(n):
    _, text, pattern = REGULAR[n]
    grammar, rng = compile_grammar(text), random.Random(n)
    for _ in range(60):
        out = walk(grammar, rng)
        assert re.fullmatch(pattern, out), (REGULAR[n][0], out)


def test_random_walks_of_a_recursive_grammar_parse_back():
    grammar, rng = compile_grammar(ARITHMETIC), random.Random(5)
    depths = []
    for _ in range(80):
        out = walk(grammar, rng, soft_limit=40)
        assert in_arithmetic(out), out
        depths.append(out.count("("))
    assert max(depths) >= 2                           # nesting was exercised


def expressions(depth: int = 0):
    leaf = st.integers(0, 999).map(str)
    if depth > 3:
        return leaf
    return st.one_of(leaf, st.builds(lambda a, op, b: f"{a}{op}{b}", expressions(depth + 1), st.sampled_from("+-*"),
                                     expressions(depth + 1)),
                     expressions(depth + 1).map(lambda e: f"({e})"))


@PROPS
@given(st.data())
def test_texts_of_the_language_are_taken_and_others_refused(data):
    n = data.draw(st.integers(0, len(REGULAR) - 1))
    _, text, pattern = REGULAR[n]
    grammar = compile_grammar(text)
    sample = data.draw(st.from_regex(pattern, fullmatch=True) | st.text(alphabet="ab,xyz\n\"=;01<>.-\u00ab\u00bbT",
                                                                         max_size=12))
    assert taken(grammar, sample) == (re.fullmatch(pattern, sample) is not None), (REGULAR[n][0], sample)


@PROPS
@given(expressions(), st.text(alphabet="0123()+-*", max_size=10))
def test_arithmetic_texts_are_taken_exactly_when_python_parses_them(expression, noise):
    grammar = compile_grammar(ARITHMETIC)
    assert taken(grammar, expression) == in_arithmetic(expression)
    assert taken(grammar, noise) == in_arithmetic(noise), noise


@pytest.mark.parametrize("text,says", [
    ('root ::= root "a" | "b"', "left-recursive"),
    ('root ::= x "a" | "b"\nx ::= y\ny ::= "c"? root', "left-recursive"),
    ("root ::= x", "'x' is not defined"),
    ('a ::= "x"', "no rule named root"),
    ('root ::= "a" root', "derives no finite text"),
    ('root ::= "a', "line 1, column 10: a literal is not closed"),
    ('root ::= "a"\n\nroot ::= "b"', "line 3, column 1: the rule 'root' is defined twice"),
    ("root ::= [z-a]", "out of order"),
    ("root ::= [^\\x00-\\U0010FFFF]", "takes no character"),
    ('root ::= "a"{3,1}', "below the minimum"),
    ('root ::= "a"{1000}', "above 256"),
    ('root ::= "\\q"', "\\q is not supported"),
    ('root ::= ("a"', "a group is not closed"),
    ('root ::= "a" @', "unexpected '@'"),
    ('root "a"', "expected ::="),
    ("", "non-empty"),
    ('root ::= "\\ud800"', "not a character"),
    ("root ::= " + " | ".join(f'"{i}"' for i in range(9000)), "longer than 32768"),
    ("\n".join(f'r{i} ::= "x"' for i in range(300)) + "\nroot ::= r0", "more than 256 rules"),
    ('root ::= ("ab"{256}){256}', "automaton nodes"),
])
def test_bad_grammars_are_refused_before_generation(text, says):
    with pytest.raises(GrammarError) as caught:
        compile_grammar(text)
    assert caught.value.code == "bad-grammar" and says in str(caught.value), str(caught.value)


def test_right_recursion_keeps_stacks_short_and_nesting_is_bounded():
    grammar = compile_grammar(REGULAR[1][1])
    state = grammar.advance(grammar.initial, b",".join([b"a"] * 500))
    assert state is not None and max(len(s) for s in state[0]) <= 2          # tail calls are not pushed
    deep = compile_grammar(ARITHMETIC)
    # each "(" holds three calls in progress (expr, term, factor)
    assert deep.advance(deep.initial, b"(" * (gbnf.MAX_STACK // 3 - 1) + b"1") is not None
    assert deep.advance(deep.initial, b"(" * (gbnf.MAX_STACK // 3 + 1)) is None   # deeper is not generated


def test_the_request_form_and_the_state_hash(fixture_slm_path):
    model = webslm.open_model(fixture_slm_path)
    first = sampler_settings(model, {"response_format": {"type": "grammar", "grammar": REGULAR[0][1]}})
    other = sampler_settings(model, {"response_format": {"type": "grammar", "grammar": REGULAR[1][1]}})
    assert first.response_format == "grammar" and first.grammar == REGULAR[0][1]
    vocab = model.architecture.vocab
    assert Sampler(first, vocab).state_hash() != Sampler(other, vocab).state_hash()
    with pytest.raises(GrammarError, match="left-recursive"):
        sampler_settings(model, {"response_format": {"type": "grammar", "grammar": "root ::= root | \"a\""}})
    with pytest.raises(Exception, match="grammar must be"):
        sampler_settings(model, {"response_format": {"type": "grammar", "grammar": 3}})


@needs_smollm2
def test_the_mask_is_exactly_the_tokens_the_recognizer_accepts():
    model = webslm.open_model(SMOLLM2)
    tokenizer, vocab = model.tokenizer, model.architecture.vocab
    eos = list(model.manifest.tokenizer["eos_ids"])
    cases = [(REGULAR[0][1], b""), (REGULAR[0][1], b"The answer is 1"), (REGULAR[3][1], b'ab,"x y'),
             (ARITHMETIC, b"(1+"), (ARITHMETIC, b"12*(3"), (REGULAR[2][1], "\u00abh\u00e9".encode())]
    for text, prefix in cases:
        mask = grammar_mask_for(tokenizer, vocab, eos, text)
        state = mask.advance(mask.initial, prefix)
        expected = np.zeros(vocab, dtype=bool)
        for token in range(len(tokenizer.tokens)):
            raw = tokenizer.piece_bytes(token)
            if raw and token not in tokenizer.special_ids and mask.advance(state, raw) is not None:
                expected[token] = True
        expected[eos] = mask.grammar.accepting(state)
        got = mask.allowed(state)
        assert np.array_equal(got, expected), prefix
        assert got.any()


@needs_smollm2
@pytest.mark.parametrize("name,question", [("answer", "Is water wet? Answer yes or no."),
                                           ("csv", "Write a CSV row of three fruits."),
                                           ("arithmetic", "Write an arithmetic expression equal to 10.")])
def test_smollm2_answers_in_the_grammars_language(name, question):
    model = webslm.open_model(SMOLLM2)
    text, pattern = (ARITHMETIC, None) if name == "arithmetic" else next((g, p) for n, g, p in REGULAR if n == name)
    s = sampler_settings(model, {"response_format": {"type": "grammar", "grammar": text}, "temperature": 0.7,
                                 "seed": 3, "max_tokens": 64})
    ids = prompt_ids(model, [{"role": "user", "content": question}])
    answers = []
    for _ in range(2):                                   # the same seed: the same answer
        deltas = list(generate(model, CpuBackend(model), ids, s))
        answers.append(("".join(d.text for d in deltas), deltas[-1].finish_reason))
    (out, reason), again = answers[0], answers[1]
    print(f"{name}: {out!r} ({reason})")
    assert again == answers[0]
    assert reason == "stop", out
    assert re.fullmatch(pattern, out) if pattern else in_arithmetic(out), out


@needs_smollm2
def test_a_raw_prompt_completion_in_grammar_mode():
    """completions.create's path: a raw prompt (no chat template) through the worker's request
    plan, continued by text of the grammar's language."""
    from webslm.worker.requests import generation_plan
    model = webslm.open_model(SMOLLM2)
    plan = generation_plan(model, {"messages": "The sum 2 + 3 * 4 can be written as", "settings": {
        "response_format": {"type": "grammar", "grammar": ARITHMETIC}, "temperature": 0.8, "seed": 5,
        "max_tokens": 12}})
    assert plan.ids == prompt_ids(model, "The sum 2 + 3 * 4 can be written as", chat=False)
    deltas = list(generate(model, CpuBackend(model), plan.ids, plan.settings))
    out = "".join(d.text for d in deltas)
    assert in_arithmetic(out), (out, deltas[-1].finish_reason)
