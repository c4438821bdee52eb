"""The worker's Python half (webslm.worker_api and webslm/worker/) in CPython, on the fixture
model: the loader's streaming validation, the engine host on the CPU path, the page's
generation request, and the test hooks that need no GPU. What needs Pyodide or a browser
GPU (admit, gpu_probe, kernel_golden, lose_device on a GPU engine) runs in tests_browser/."""
import json

import pytest

import webslm
from webslm import worker_api
from webslm.cpu import CpuBackend
from webslm.generate import generate, prompt_ids
from webslm.semantic.ledger import Ledger
from webslm.worker.requests import RequestError, WorkerRequestFailed, generation_request


class JsChunk:
    """What the worker hands feed(): a JS Uint8Array, which Pyodide exposes with to_memoryview()."""
    def __init__(self, data: bytes):
        self.data = data

    def to_memoryview(self):
        return memoryview(self.data)


def load(data: bytes, chunk: int = 4096):
    """Feed `data` as the worker does; (loader, reply of finish() or of the feed that rejected)."""
    loader = worker_api.ModelLoader()
    for start in range(0, len(data), chunk):
        rejected = loader.feed(JsChunk(data[start:start + chunk]))
        if rejected:
            return loader, {"error": json.loads(rejected)}
    return loader, json.loads(loader.finish())


@pytest.fixture
def host(fixture_slm):
    loader, reply = load(fixture_slm)
    events = []
    host = worker_api.engine_host(loader, events.append)
    host.events = events
    return host


def test_the_loader_accepts_the_fixture_and_summarizes_it(fixture_slm):
    loader, reply = load(fixture_slm)
    model = reply["model"]
    assert loader.model is not None
    assert model["bytes"] == len(fixture_slm)
    assert model["artifact_sha256"] == loader.model.identity.artifact_sha256
    assert set(model["generation"]) >= {"temperature", "top_p", "top_k", "max_new_tokens"}


def test_the_loader_rejects_a_damaged_file_with_the_validators_words(fixture_slm):
    damaged = bytearray(fixture_slm)
    damaged[len(damaged) // 2] ^= 0xFF
    loader, reply = load(bytes(damaged))
    assert set(reply["error"]) == {"code", "where", "sentence"}
    assert loader.model is None


def test_a_host_needs_a_model_the_loader_accepted():
    with pytest.raises(ValueError, match="not accepted"):
        worker_api.engine_host(worker_api.ModelLoader(), None)


def test_generate_on_the_cpu_path_is_the_cpu_oracles_greedy_answer(run, host, fixture_slm_path):
    messages = [{"role": "user", "content": "Hello"}]
    deltas = []
    result = json.loads(run(host.generate(json.dumps({"messages": messages, "settings": {"temperature": 0,
                                                                                         "max_tokens": 8}}),
                                          lambda d: deltas.append(json.loads(d)))))
    model = webslm.open_model(fixture_slm_path)          # the oracle: its own model, CPU backend and ledger
    ledger = Ledger()
    settings = webslm.SamplerSettings(temperature=0, max_tokens=8)
    expected = "".join(d.text for d in generate(model, CpuBackend(model), prompt_ids(model, "Hello", chat=True),
                                                settings, ledger=ledger))
    assert result["text"] == expected == "".join(d["text"] for d in deltas)
    assert result["token_ids"] == list(ledger.committed_ids)
    assert result["backend"] == "cpu" and result["backends"] == ["cpu"]
    assert result["engine"]["cpu_reason"]["code"] == "not-admitted"
    assert result["device_destroyed_after"] is None
    assert any(json.loads(e)["event"] == "state" for e in host.events)


def test_an_answer_stopped_before_it_reached_the_engine_ends_abort_with_nothing(run, host):
    """The worker's Stop can land after the answer left its queue but before the engine began
    it (engine.cancel() sees no answer then): generate() asks stopped() first and ends the
    answer "abort" with no text, no delta and the engine untouched; a later answer runs."""
    run(host.use_cpu())
    request = json.dumps({"messages": [{"role": "user", "content": "Hello"}], "settings": {"temperature": 0, "max_tokens": 4}})
    deltas, asked = [], []
    stopped = json.loads(run(host.generate(request, deltas.append, None, lambda: asked.append(1) or True)))
    assert stopped == {"text": "", "finish_reason": "abort", "backend": None} and deltas == [] and asked == [1]
    assert json.loads(host.engine_status())["state"] == "CPUReady"
    answered = json.loads(run(host.generate(request, deltas.append, None, lambda: False)))
    assert answered["finish_reason"] == "length" and answered["text"] and deltas


def test_use_cpu_then_release(run, host):
    reply = json.loads(run(host.use_cpu()))
    assert reply["engine"]["backend"] == "cpu"
    assert reply["engine"]["cpu_reason"]["code"] == "gpu-disabled"
    assert json.loads(host.engine_status())["backend"] == "cpu"
    assert host.cancel() is False                    # no answer in progress
    run(host.release())
    assert json.loads(host.engine_status()) == {"state": "Empty", "backend": None, "cpu_reason": None, "tier": None,
                                                "choice": None}


def test_gpu_only_requests_fail_on_a_cpu_engine(run, host):
    run(host.use_cpu())
    with pytest.raises(WorkerRequestFailed, match="no device to lose"):
        worker_api.lose_device(host, 3)
    with pytest.raises(WorkerRequestFailed, match="needs the engine on the GPU"):
        run(host.conformance(4))


HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("request_, code, message", [
    ({"messages": []}, "bad-request", "1 to 256 messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "bad-request", "role must be one of"),
    ({"messages": [{"role": "user"}]}, "bad-request", "must be {role, content}"),
    ({"messages": HI, "settings": {"beam": 4}}, "unknown-setting", "is not a sampling setting"),
    ({"messages": HI, "settings": {"temperature": -1}}, "out-of-range", "temperature"),
    ({"prompt": "hi"}, "bad-request", "is {messages, settings}"),
    ({"messages": HI, "settings": None}, "bad-request", "settings"),
    # validated, not coerced: a string is not a list of stop sequences (it was split into characters)
    ({"messages": HI, "settings": {"stop": "abc"}}, "bad-type", "stop"),
    ({"messages": HI, "settings": {"stop": [""]}}, "out-of-range", "stop"),
    ({"messages": HI, "settings": {"stop": [1]}}, "bad-type", "stop"),
    ({"messages": HI, "settings": {"stop": None}}, "bad-type", "stop"),
    ({"messages": HI, "settings": {"max_tokens": 1.5}}, "bad-type", "max_tokens"),
    ({"messages": HI, "settings": {"temperature": True}}, "bad-type", "temperature"),
    ({"messages": [{"role": "user", "content": "a\ud800"}]}, "bad-prompt", "lone surrogate"),
    ({"messages": [{"role": "user", "content": "word " * 20000}]}, "prompt-too-long", "context"),
])
def test_a_bad_generation_request_is_a_request_error(host, request_, code, message):
    with pytest.raises(RequestError, match=message.replace("{", r"\{").replace("}", r"\}")) as caught:
        generation_request(host.semantic_model(), request_)
    assert caught.value.code == code


def test_the_host_answers_a_bad_request_with_a_request_error_before_any_work(run, host, monkeypatch):
    """What worker.mjs turns into a typed "bad-field" reply: the class name RequestError."""
    from webslm.semantic.chat_template import ChatTemplate
    with pytest.raises(RequestError) as caught:
        run(host.generate(json.dumps({"messages": HI, "settings": {"stop": "abc"}}), lambda d: None))
    assert caught.value.code == "bad-type"
    assert host.engine is None                      # refused before an engine was even made
    monkeypatch.setattr(host.semantic_model(), "chat_template", ChatTemplate("{{ '%(a)999999999s' % {'a': 1} }}"))
    with pytest.raises(RequestError) as caught:
        run(host.generate(json.dumps({"messages": HI, "settings": {}}), lambda d: None))
    assert caught.value.code == "bad-template"


def test_settings_are_laid_over_the_models_defaults(host):
    defaults = host.model.manifest.generation
    _, settings = generation_request(host.semantic_model(), {"messages": [{"role": "user", "content": "hi"}],
                                                             "settings": {"top_k": 3, "stop": ["\n"]}})
    assert settings.top_k == 3 and settings.stop == ("\n",)
    assert settings.temperature == defaults["temperature"] and settings.max_tokens == defaults["max_new_tokens"]


def test_the_no_gpu_test_hooks_answer_in_cpython(host):
    assert json.loads(worker_api.sampler_check())
    reply = json.loads(worker_api.tokenizer_check(host, 2000))
    assert set(reply) == {"digest", "measure"}


def test_the_loader_refuses_a_size_claim_before_allocating_for_it(fixture_slm):
    """The worker passes the real size where it knows it (a picked file, the cache, this
    site's own download): a header that claims more is refused on its first 128 bytes."""
    import tracemalloc

    import slm_surgery as surgery
    from webslm.artifact import format as fmt
    payload_offset = fmt.HEADER.unpack_from(fixture_slm)[7]
    claim = surgery.join(surgery.split(fixture_slm), header={"payload_length": 1 << 30,
                                                            "file_length": payload_offset + (1 << 30) + 32})
    tracemalloc.start()
    loader = worker_api.ModelLoader(len(fixture_slm))
    rejected = loader.feed(JsChunk(claim[:4096]))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert json.loads(rejected)["code"] == "truncated" and peak < 4 << 20
    unknown = worker_api.ModelLoader()          # another server's download: the size is unknown
    assert unknown.feed(JsChunk(claim[:4096])) is None
    assert json.loads(unknown.finish())["error"]["code"] == "truncated"


@pytest.fixture
def empty_tuning_cache(monkeypatch):
    from webslm.worker import engine_host
    monkeypatch.setattr(engine_host, "_TUNING_CACHE", {})
    return engine_host


@pytest.mark.parametrize("kept", [None, "", "not json", "[1, 2]", '{"k": 3}', "[" * 100_000,
                                  '{"a": {}}' + " " * (4 << 20)])
def test_a_kept_tuning_cache_that_is_not_one_adds_nothing(empty_tuning_cache, kept):
    """What the worker read from Cache Storage is untrusted text (worker/tuning-store.mjs):
    anything that is not a JSON object of objects, or is too long, adds no entry and raises
    nothing."""
    assert worker_api.merge_tuning_cache(kept) == 0
    assert json.loads(worker_api.tuning_cache_text()) == {}


def test_a_kept_tuning_cache_is_merged_and_handed_back_whole(empty_tuning_cache):
    """Kept entries join the worker's cache (those it holds win: they are this worker's own
    measurements); the text handed back to keep is the whole cache."""
    empty_tuning_cache._TUNING_CACHE["dev|bundle|form a"] = {"choice": None, "rule_us": 1.0}
    kept = json.dumps({"dev|bundle|form a": {"choice": {"variant": "", "WG": 64, "ROWS": 2}},
                       "dev|bundle|form b": {"choice": {"variant": "tiles"}}, "junk": 3})
    assert worker_api.merge_tuning_cache(kept) == 1
    whole = json.loads(worker_api.tuning_cache_text())
    assert whole == {"dev|bundle|form a": {"choice": None, "rule_us": 1.0},
                     "dev|bundle|form b": {"choice": {"variant": "tiles"}}}
    assert worker_api.merge_tuning_cache(worker_api.tuning_cache_text()) == 0     # nothing new


def test_admit_refuses_an_unknown_tuning_mode_before_any_work(run, host):
    with pytest.raises(ValueError, match="tuning must be"):
        run(host.admit("auto", None, "ua", print, print, "force", "fast"))


def test_tuning_left_for_later_is_nothing_to_do_on_a_cpu_engine(run, host):
    """tune_later (the worker calls it when idle after a deferred admission) on an engine that
    is not on a GPU measures nothing and says there is nothing left; stop_tuning is harmless."""
    run(host.use_cpu())
    host.stop_tuning()
    assert json.loads(run(host.tune_later())) == {"tuning": None, "tuning_new_entries": 0, "deferred": False}
