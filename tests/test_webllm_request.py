"""The OpenAI/WebLLM request fields as the worker's Python half takes them (worker/requests.py,
request.py), on the fixture model in CPython: each is validated with a typed error before any
work, and each changes the answer for real (the CPU engine, the same code the worker runs).
web/webslm.js maps WebLLM's names onto these settings (docs/js-api.md)."""
import json
import math

import numpy as np
import pytest

import webslm
from webslm import worker_api
from webslm.cpu import CpuBackend
from webslm.generate import generate, prompt_ids
from webslm.request import sampler_settings
from webslm.semantic.ledger import Ledger
from webslm.worker.requests import RequestError, generation_request
from test_worker_host import load

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def host(fixture_slm):
    loader, _ = load(fixture_slm)
    return worker_api.engine_host(loader, lambda event: None)


@pytest.fixture
def model(host):
    return host.semantic_model()


def settings_of(model, **settings):
    return generation_request(model, {"messages": HI, "settings": settings})[1]


def answer(run, host, messages=HI, **settings):
    """The host's reply (JSON-decoded) and the deltas it streamed."""
    deltas = []
    reply = run(host.generate(json.dumps({"messages": messages, "settings": settings}),
                              lambda d: deltas.append(json.loads(d))))
    return json.loads(reply), deltas


# -- validation -------------------------------------------------------------------------------------

def test_the_penalties_and_logprobs_reach_the_sampler(model):
    s = settings_of(model, frequency_penalty=0.5, presence_penalty=-0.25, repetition_penalty=1.1,
                    logprobs=True, top_logprobs=3)
    assert (s.frequency_penalty, s.presence_penalty, s.repetition_penalty) == (0.5, -0.25, 1.1)
    assert s.logprobs and s.top_logprobs == 3


def test_logit_bias_takes_jsons_string_keys(model):
    assert settings_of(model, logit_bias={"7": -100, "3": 2.5}).logit_bias == ((3, 2.5), (7, -100.0))


def test_ignore_eos_bans_the_models_eos_ids_over_any_bias(model):
    eos = model.manifest.tokenizer["eos_ids"]
    s = settings_of(model, ignore_eos=True, logit_bias={str(eos[0]): 5, "3": 1})
    assert dict(s.logit_bias) == {3: 1.0, **{t: -math.inf for t in eos}}
    assert settings_of(model, ignore_eos=False).logit_bias == ()


@pytest.mark.parametrize("settings, code, where", [
    ({"logit_bias": {"x1": 1}}, "bad-type", "logit_bias"),
    ({"logit_bias": {"-1": 1}}, "bad-type", "logit_bias"),
    ({"logit_bias": {"99999": 1}}, "out-of-range", "logit_bias"),          # past the vocabulary
    ({"logit_bias": {"1": 150}}, "out-of-range", "logit_bias[1]"),
    ({"logit_bias": {"1": "up"}}, "bad-type", "logit_bias[1]"),
    ({"frequency_penalty": "high"}, "bad-type", "frequency_penalty"),
    ({"repetition_penalty": 0}, "out-of-range", "repetition_penalty"),
    ({"top_logprobs": 2}, "out-of-range", "top_logprobs"),                  # without logprobs
    ({"logprobs": True, "top_logprobs": 30}, "out-of-range", "top_logprobs"),
    ({"ignore_eos": "yes"}, "bad-type", "ignore_eos"),
    ({"n": 2}, "unknown-setting", "n"),                                     # n is the page's loop
])
def test_a_bad_field_is_a_typed_request_error(model, settings, code, where):
    with pytest.raises(RequestError) as caught:
        settings_of(model, **settings)
    assert (caught.value.code, caught.value.where) == (code, where)


def test_text_parts_are_joined_and_other_parts_refused(model):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}]
    ids, _ = generation_request(model, {"messages": parts, "settings": {}})
    assert ids == prompt_ids(model, [{"role": "user", "content": "Hello\nthere"}])
    for bad, message in [
        ([{"type": "image_url", "image_url": {"url": "x"}}], "only text parts"),
        ([{"type": "text", "text": 5}], "must be {type"),
        ([{"type": "text", "text": "a", "extra": 1}], "must be {type"),
        (["plain"], "must be {type"),
        ([], "1 to 64 text parts"),
    ]:
        with pytest.raises(RequestError, match=message.replace("{", r"\{")):
            generation_request(model, {"messages": [{"role": "user", "content": bad}], "settings": {}})


def test_a_raw_prompt_is_encoded_without_the_chat_template(model):
    ids, _ = generation_request(model, {"messages": "Once upon a time", "settings": {}})
    assert ids == prompt_ids(model, "Once upon a time", chat=False)
    assert ids != prompt_ids(model, "Once upon a time", chat=True)
    with pytest.raises(RequestError, match="1 to"):
        generation_request(model, {"messages": "", "settings": {}})


def test_roles_webslm_does_not_serve_are_refused(model):
    for message in ({"role": "tool", "content": "42", "tool_call_id": "0"}, {"role": "tool", "content": "42"},
                    {"role": "user", "content": "hi", "name": "ann"}):
        with pytest.raises(RequestError):
            generation_request(model, {"messages": [message], "settings": {}})


# -- each field changes the answer, as the CPU oracle says ------------------------------------------

def oracle(model, messages, **settings):
    """generate.py's synchronous loop on a fresh CPU backend, the settings laid over the model's
    defaults as the worker lays them: text and committed ids."""
    ledger = Ledger()
    s = sampler_settings(model, settings)
    text = "".join(d.text for d in generate(model, CpuBackend(model), prompt_ids(model, messages), s, ledger=ledger))
    return text, list(ledger.committed_ids)


def test_a_ban_on_the_greedy_first_token_changes_the_answer(run, host, fixture_slm_path):
    plain, _ = answer(run, host, temperature=0, max_tokens=6)
    first = plain["token_ids"][0]
    banned, _ = answer(run, host, temperature=0, max_tokens=6, logit_bias={str(first): -100})
    assert banned["token_ids"][0] != first
    model = webslm.open_model(fixture_slm_path)
    text, ids = oracle(model, HI, temperature=0, max_tokens=6, logit_bias={first: -100.0})
    assert banned["token_ids"] == ids and banned["text"] == text


def test_ignore_eos_runs_to_max_tokens(run, host, fixture_slm_path):
    model = webslm.open_model(fixture_slm_path)
    eos = set(model.manifest.tokenizer["eos_ids"])
    reply, _ = answer(run, host, temperature=1.0, seed=3, max_tokens=24, ignore_eos=True)
    assert reply["finish_reason"] == "length" and reply["usage"]["completion_tokens"] == 24
    assert not eos & set(reply["token_ids"])


def test_penalties_follow_the_cpu_oracle(run, host, fixture_slm_path):
    model = webslm.open_model(fixture_slm_path)
    fields = dict(temperature=0.8, top_k=20, seed=11, max_tokens=12, frequency_penalty=1.5, presence_penalty=0.5)
    reply, _ = answer(run, host, **fields)
    text, ids = oracle(model, HI, **fields)
    assert reply["token_ids"] == ids and reply["text"] == text
    plain, _ = answer(run, host, **{**fields, "frequency_penalty": 0.0, "presence_penalty": 0.0})
    assert plain["token_ids"] != ids          # the penalties are not accepted and ignored


def test_logprobs_cover_every_committed_token_once(run, host):
    reply, deltas = answer(run, host, temperature=0.7, seed=5, max_tokens=10, logprobs=True, top_logprobs=3)
    entries = reply["logprobs"]
    assert len(entries) == reply["usage"]["completion_tokens"] == len(reply["token_ids"])
    streamed = [e for d in deltas for e in d["logprobs"]]
    assert streamed == entries[:len(streamed)]              # the rest came with the end
    model = host.semantic_model()
    for token_id, entry in zip(reply["token_ids"], entries):
        raw = model.tokenizer.piece_bytes(token_id)
        assert entry["bytes"] == list(raw) and entry["token"] == raw.decode("utf-8", "replace")
        assert entry["logprob"] <= 0.0 and len(entry["top_logprobs"]) == 3
        tops = [t["logprob"] for t in entry["top_logprobs"]]
        assert tops == sorted(tops, reverse=True) and entry["logprob"] <= tops[0]
        assert math.fsum(np.exp(tops)) <= 1.0 + 1e-12
    plain, _ = answer(run, host, temperature=0.7, seed=5, max_tokens=10)
    assert plain["logprobs"] is None and plain["token_ids"] == reply["token_ids"]   # reporting only


def test_reset_chat_makes_the_next_answer_read_its_whole_prompt(run, host):
    answer(run, host, temperature=0, max_tokens=4)
    again, _ = answer(run, host, temperature=0, max_tokens=4)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert host.reset_chat() is True
    fresh, _ = answer(run, host, temperature=0, max_tokens=4)
    assert fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert fresh["token_ids"] == again["token_ids"]
