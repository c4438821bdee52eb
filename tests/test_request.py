"""request.py: a prompt and a set of settings mean the same wherever they are given (the
CLI, the Engine). prompt_ids takes text, messages or ids; sampler_settings lays a request's
settings over the model's defaults, which the fixture sets deliberately unlike
SamplerSettings' own (webslm.fixture.GENERATION), so a default that is not read shows."""
from __future__ import annotations

import json

import pytest

import webslm
from webslm.cli import main
from webslm.engine import Engine, EngineError
from webslm.fixture import GENERATION
from webslm.request import InvalidRequest, prompt_ids, sampler_settings
from webslm.semantic.sampler import SamplerError, SamplerSettings

from test_engine import reference


@pytest.fixture(scope="module")
def model(fixture_slm):
    return webslm.open_model(fixture_slm)


def templated(model, messages) -> list[int]:
    return model.tokenizer.encode(model.chat_template.render(messages, add_generation_prompt=True),
                                  add_special=False)


# -- prompt ids ----------------------------------------------------------------------------------

def test_text_is_one_user_message_or_plain_text(model):
    assert prompt_ids(model, "hi") == templated(model, [{"role": "user", "content": "hi"}])
    assert prompt_ids(model, "hi", chat=False) == model.tokenizer.encode("hi")
    assert prompt_ids(model, "hi", chat=False, system="ignored") == model.tokenizer.encode("hi")


def test_a_system_prompt_goes_first_unless_there_is_one(model):
    user = {"role": "user", "content": "hi"}
    system = {"role": "system", "content": "be brief"}
    assert prompt_ids(model, "hi", system="be brief") == templated(model, [system, user])
    assert prompt_ids(model, [user], system="be brief") == templated(model, [system, user])
    assert prompt_ids(model, [system, user], system="other") == templated(model, [system, user])


def test_ids_are_taken_as_they_are(model):
    import numpy as np
    assert prompt_ids(model, [3, np.int64(4)]) == [3, 4]


@pytest.mark.parametrize("bad", [[], [1.5], ["hi"], [True], 7])
def test_anything_else_is_a_bad_prompt(model, bad):
    with pytest.raises(InvalidRequest) as info:
        prompt_ids(model, bad)
    assert info.value.code == "bad-prompt"


# -- settings ------------------------------------------------------------------------------------

def test_no_settings_are_the_models_defaults(model):
    settings = sampler_settings(model)
    assert (settings.temperature, settings.top_p, settings.top_k, settings.min_p,
            settings.repetition_penalty, settings.max_tokens) == \
        (GENERATION["temperature"], GENERATION["top_p"], GENERATION["top_k"], GENERATION["min_p"],
         GENERATION["repetition_penalty"], GENERATION["max_new_tokens"])
    assert (settings.seed, settings.stop, settings.frequency_penalty) == (0, (), 0.0)


def test_given_settings_win_and_the_rest_stay_the_models(model):
    settings = sampler_settings(model, {"temperature": 0.0, "stop": ["\n"], "max_tokens": 5, "seed": 9})
    assert settings == SamplerSettings(temperature=0.0, top_p=GENERATION["top_p"], top_k=GENERATION["top_k"],
                                       min_p=GENERATION["min_p"], repetition_penalty=GENERATION["repetition_penalty"],
                                       max_tokens=5, seed=9, stop=("\n",))


def test_an_unknown_setting_or_a_bad_value_is_refused(model):
    with pytest.raises(InvalidRequest) as info:
        sampler_settings(model, {"temprature": 0.5})
    assert info.value.code == "unknown-setting" and info.value.where == "temprature"
    with pytest.raises(SamplerError) as bad:
        sampler_settings(model, {"stop": "\n"})            # one string is not a list of stops
    assert bad.value.code == "bad-type"


def test_the_engine_takes_a_dict_of_settings_or_none(model, run):
    engine = Engine(model)
    run(engine.load())
    ids = prompt_ids(model, "hi")

    async def answer(settings):
        return [d async for d in engine.generate("hi", settings)], engine.ledger.committed_ids
    overrides = {"seed": 3, "max_tokens": 6}
    expected = reference(model, ids, sampler_settings(model, overrides))
    assert run(answer(overrides)) == (expected.deltas, expected.ids)
    expected = reference(model, ids, sampler_settings(model))
    assert run(answer(None)) == (expected.deltas, expected.ids)
    with pytest.raises(EngineError) as info:
        run(answer({"temprature": 0.5}))
    assert info.value.code == "unknown-setting"


# -- the command line ----------------------------------------------------------------------------

def test_cli_generate_keeps_the_models_defaults_it_is_not_given(fixture_slm_path, model, capsys):
    assert main(["generate", "--model", str(fixture_slm_path), "--prompt", "hi", "--chat", "--greedy",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    settings = sampler_settings(model, {"temperature": 0.0})
    assert settings.max_tokens == GENERATION["max_new_tokens"]
    expected = reference(model, prompt_ids(model, "hi"), settings)
    assert tuple(out["token_ids"]) == expected.ids and out["finish_reason"] == expected.finish
    assert out["text"] == "".join(d.text for d in expected.deltas)


def test_cli_generate_refuses_a_bad_setting_without_a_traceback(fixture_slm_path, capsys):
    assert main(["generate", "--model", str(fixture_slm_path), "--prompt", "hi", "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err
