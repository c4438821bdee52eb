"""The browser matrix over the served app: in every engine row, the worker boots Pyodide +
numpy + webslm, answers the versioned protocol, survives malformed messages, and runs the
reference WGSL kernel on navigator.gpu against numpy (or reports cleanly that there is no
WebGPU adapter). Every request the page and its worker make goes to the serving origin.

Run with -s to see each row's adapter table and boot times (also in tests_browser/results/).
"""
from __future__ import annotations

import functools
import json
import pathlib
from urllib.parse import urlsplit

import pytest

from webslm import shader_bundle


def test_worker_boots_python_numpy_and_webslm(booted):
    status = booted.status
    assert status["pyodide"] == "0.27.7"
    assert status["python"].startswith("3.12.")
    assert status["numpy"] == "2.0.2"
    assert status["numpy_check"] == 285.0          # sum of squares 0..9, computed in the worker
    assert status["platform"] == "emscripten"
    # the wheel's shaders are the checkout's, verified in the worker against BUNDLE.json
    assert status["shader_bundle_origin"] == "wheel"
    assert status["shader_bundle_hash"] == shader_bundle.bundle_hash()
    assert status["manifest_shader_bundle_hash"] == status["shader_bundle_hash"]
    print(f"\n{booted.row.name}: cold boot {json.dumps(booted.results['boot_cold'])}")


def test_gpu_probe_runs_wgsl_or_reports_no_adapter(booted):
    """The worker's GPU check ("auto": Python chooses the adapter): the reference WGSL kernel
    on navigator.gpu against numpy, or a clean report that there is no adapter."""
    report = booted.request("gpu-probe", {"featureLevel": "auto", "seed": 0})
    assert "error" not in report, report
    feature_level = booted.row.adapter_options.get("featureLevel", "core")
    booted.record(gpu=report)
    print(f"\n{booted.row.name}: {json.dumps({k: report.get(k) for k in ('outcome', 'tier', 'feature_level', 'seconds')})}")
    if report["adapter"] is None:
        assert booted.row.expects_webgpu is not True, "this row should have a WebGPU adapter"
        assert report["outcome"] == "no-webgpu-adapter"
        return
    assert booted.row.expects_webgpu is not False, "this row should have no WebGPU adapter"
    adapter = report["adapter"]
    print(f"features: {adapter['features']}\nlimits: {json.dumps(adapter['limits'])}")
    assert report["outcome"] == "passed", json.dumps(report["cases"], indent=1)
    assert report["gpu_errors"] == []
    assert all(case["unwritten"] == 0 for case in report["cases"])
    if booted.row.expects_webgpu:
        assert report["feature_level"] == feature_level
    if feature_level == "compatibility":
        assert adapter["limits"]["maxStorageBufferBindingSize"] == 128 * 1024 * 1024


@pytest.mark.parametrize("raw, code", [
    ("42", "bad-message"),
    ("null", "bad-message"),
    ("[1, 2]", "bad-message"),
    ('{"protocol": "webslm/0", "id": 1, "type": "ping"}', "bad-message"),
    ('{"protocol": "webslm/1", "id": -1, "type": "ping"}', "bad-message"),
    ('{"protocol": "webslm/1", "id": 1.5, "type": "ping"}', "bad-message"),
    ('{"protocol": "webslm/1", "id": 900001, "type": "format-disk"}', "unknown-type"),
    ('{"protocol": "webslm/1", "id": 900002, "type": "toString"}', "unknown-type"),
    ('{"protocol": "webslm/1", "id": 900003, "type": "ping", "extra": 1}', "bad-field"),
    ('{"protocol": "webslm/1", "id": 900004, "type": "gpu-probe", "seed": 1}', "bad-field"),
    ('{"protocol": "webslm/1", "id": 900005, "type": "gpu-probe", "featureLevel": "fast", "seed": 1}', "bad-field"),
    ('{"protocol": "webslm/1", "id": 900006, "type": "gpu-probe", "featureLevel": "core", "seed": -3}', "bad-field"),
    ('{"protocol": "webslm/1", "id": 900007, "type": "gpu-probe", "featureLevel": "core", "seed": "7"}', "bad-field"),
])
def test_malformed_message_gets_typed_error_and_worker_keeps_answering(booted, raw, code):
    answer = booted.send_raw(raw)
    assert answer["type"] == "error"
    assert answer["error"]["code"] == code, answer
    assert isinstance(answer["error"]["message"], str) and answer["error"]["message"]
    assert booted.request("ping") == {"pong": True}


def test_page_shows_the_model_and_the_engine(booted):
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
    model = booted.row.eval("document.getElementById('model-state').textContent")
    assert _default_model_entry()["artifact_sha256"] in model, model
    badge = booted.row.eval("document.getElementById('engine-badge').textContent")
    assert badge.startswith("GPU") or badge == "CPU", badge


def test_every_request_goes_to_the_serving_origin(booted):
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(booted.url))
    page = booted.row.eval("performance.getEntriesByType('resource').map(e => e.name)")
    worker = booted.request("resource-log")["urls"]
    seen = booted.row.requests() or []
    urls = [u for u in [*page, *worker, *seen] if not u.startswith(("data:", "blob:"))]
    assert any("pyodide.asm.wasm" in u for u in urls), "the worker's own requests were not observed"
    foreign = sorted({u for u in urls if not u.startswith(origin + "/")})
    assert foreign == [], foreign


def test_gpu_probe_request_validates_and_runs_with_a_given_seed(booted):
    """The protocol path driven directly, with the row's feature level."""
    feature_level = booted.row.adapter_options.get("featureLevel", "core")
    report = booted.request("gpu-probe", {"featureLevel": feature_level, "seed": 5})
    has_adapter = booted.row.expects_webgpu is True or (
        booted.row.expects_webgpu is None and booted.request("gpu-probe", {"featureLevel": "auto", "seed": 0})["adapter"] is not None)
    assert report["outcome"] == ("passed" if has_adapter else "no-webgpu-adapter")


def _default_model_entry() -> dict:
    manifest = json.loads((pathlib.Path(__file__).resolve().parents[1] / ".assets/site/manifest.json").read_text())
    return next(m for m in manifest["models"] if m["default"])


def test_default_model_streams_into_the_worker_and_validates(booted):
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
    model = booted.row.eval("window.webslm.engine.model")
    entry = _default_model_entry()
    assert model["artifact_sha256"] == entry["artifact_sha256"]
    assert model["bytes"] == entry["bytes"]
    assert model["architecture"]["n_layers"] == 30 and model["architecture"]["vocab"] == 49152
    booted.record(model={k: model[k] for k in ("validation_seconds", "total_seconds", "bytes")})
    print(f"\n{booted.row.name}: default model validated in {model['validation_seconds']} s "
          f"({model['total_seconds']} s with the download)")
    assert model["source"] in ("network", "cache")


def test_a_file_that_is_not_an_artifact_is_rejected_with_its_code(booted):
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
    answer = booted.send_raw('{"protocol": "webslm/1", "id": 910001, "type": "load-model", "source": {"url": "assets/manifest.json"},'
                             ' "sha256": null, "name": null, "cache": false}')
    assert answer["type"] == "error" and answer["error"]["code"] == "bad-artifact", answer
    assert answer["error"]["details"]["code"] == "bad-magic"
    assert booted.request("ping") == {"pong": True}


@pytest.mark.parametrize("url", ["file:///etc/passwd", "javascript:alert(1)", "data:application/octet-stream,SLM"])
def test_load_model_takes_only_http_urls(booted, url):
    answer = booted.send_raw(json.dumps({"protocol": "webslm/1", "id": 910002, "type": "load-model", "source": {"url": url},
                                         "sha256": None, "name": None, "cache": False}))
    assert answer["error"]["code"] == "bad-field", answer
    assert "http" in answer["error"]["message"]


def test_load_model_messages_are_validated(booted):
    for fields in ({"source": {"url": "a.slm", "file": None}, "sha256": None, "name": None, "cache": False},
                   {"source": {"url": "a.slm"}, "sha256": "ABC", "name": None, "cache": False},
                   {"source": {"url": "a.slm"}, "sha256": None, "name": None, "cache": "yes"},
                   {"url": "a.slm"}):
        answer = booted.send_raw(json.dumps({"protocol": "webslm/1", "id": 910003, "type": "load-model", **fields}))
        assert answer["error"]["code"] == "bad-field", (fields, answer)


@functools.cache
def _cpython_sampler_run() -> dict:
    """The sampler vectors' run in CPython: the same in every row, computed once a session."""
    from webslm.semantic.sampler_vectors import reference_run
    return reference_run()


@functools.cache
def _cpython_corpus_digest(chars: int) -> str:
    """CPython's digest of the default model's token ids for the mixed corpus, once a session."""
    import webslm
    from webslm.semantic.corpus import corpus, ids_digest
    model = webslm.open_model(pathlib.Path(__file__).resolve().parents[1] / ".assets/site" / _default_model_entry()["file"])
    return ids_digest(model.tokenizer, corpus(chars))


def test_sampler_choices_are_bit_identical_to_cpython(booted):
    """Same logits and seeds -> the same tokens and state hashes in this browser's Pyodide as
    in CPython here (deterministic exp, Philox RNG; docs/sampler.md)."""
    native = _cpython_sampler_run()
    in_browser = booted.request("sampler-check")
    assert in_browser["digest"] == native["digest"]
    assert in_browser == native


def test_tokenizer_gives_cpythons_token_ids(booted):
    """The default model's tokenizer in this browser's Pyodide encodes a mixed corpus (scripts,
    emoji, code, chat markup) to exactly the ids CPython gets."""
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
    chars = 100_000
    in_browser = booted.request("tokenizer-check", {"chars": chars}, timeout_s=600)
    assert in_browser["digest"] == _cpython_corpus_digest(chars)
    booted.record(tokenizer=in_browser["measure"])


def test_generate_requests_are_validated(booted):
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
    bad = booted.send_raw('{"protocol": "webslm/1", "id": 920001, "type": "generate", "messages": [{"role": "root", "content": "x"}], "settings": {}}')
    assert bad["error"]["code"] == "bad-field", bad
    bad = booted.send_raw('{"protocol": "webslm/1", "id": 920002, "type": "generate", "messages": [{"role": "user", "content": "x"}], "settings": {"temperature": -1}}')
    assert bad["error"]["code"] == "bad-field", bad
    assert booted.request("ping") == {"pong": True}
