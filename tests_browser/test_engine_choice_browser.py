"""The page as a first visit gets it, in one row each (the row does not change what they check):

- Chromium (SwiftShader, a software adapter): by default the page estimates the CPU path's
  decode step and hands it to admission, whose step-floor stage times the step's costliest mat-vec
  on SwiftShader (py/webslm/backends/gpu/step_floor.py): even that lower bound is many times
  slower, so admission stops before compiling the step (its compile stage took 31.5 s of a
  first visit before) and the CPU answers; the badge, its tooltip, the note and the admission
  line say why, with the numbers, and how to keep the GPU (?gpu=force, which the other tests'
  pages use).
- chromium-compat: the built site served under a sub-path (https://host/app/) opens, boots,
  loads the model, reaches a ready page and answers, every request staying under /app/.

The Chromium row's page is opened as a user opens it (no ?gpu=, conftest.py: its engine is not
forced onto the GPU), so the first check reads that page as it booted, before any other test
of the row changes it (conftest.py, first_in_row): opening it again would cost another
admission and another timed step on SwiftShader, for the same page. The sub-path opens a
site of its own and leaves the row's page there, so it runs last in its row (last_in_row).
Numbers go to tests_browser/results/<row>.json under "choice".
"""
from __future__ import annotations

import json
import pathlib

import pytest
from app_session import static_site
from conftest import GREEDY_PROMPT as PROMPT

ROOT = pathlib.Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 900
ANSWER_TIMEOUT_S = 600
SHORT = {"temperature": 0, "max_tokens": 6}


def _record(booted, key: str, value) -> None:
    booted.results.setdefault("choice", {})[key] = value
    booted.record()


def _open_and_wait(booted, url: str) -> dict:
    # the row's page may still be loading its model: gone first, so none of its requests is logged
    booted.row.open("about:blank")
    booted.row.clear_requests()
    booted.row.open(url)
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=READY_TIMEOUT_S)
    return booted.row.eval("window.webslm.engine")


def _text(booted, element_id: str, attribute: str = "textContent") -> str:
    return booted.row.eval(f"document.getElementById({json.dumps(element_id)}).{attribute}")


@pytest.mark.first_in_row          # the row's page as it booted: nothing else has touched it yet
def test_by_default_swiftshader_is_bounded_before_compiling_and_the_cpu_answers_with_the_reason_shown(booted):
    if booted.row.name != "chromium":
        pytest.skip("SwiftShader is Chromium's adapter (the other GPU rows are software too, and force the GPU)")
    # the page the row booted is the page's default: opened at the site's URL with no ?gpu=
    assert booted.query == "" and booted.row.eval("location.href") == booted.url, booted.query
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=READY_TIMEOUT_S)
    engine = booted.row.eval("window.webslm.engine")
    admission = booted.row.eval("window.webslm.admission")
    choice, reason = engine["choice"], engine["cpuReason"]
    print(f"\n{booted.row.name}: {json.dumps(choice)}")
    # admission stopped at its step-floor stage: nothing past it ran (no compile, no self-test)
    assert admission["admitted"] is False and admission["code"] == "gpu-slower", admission
    assert admission["stage"] == "step-floor" and admission["stages"][-1] == "step-floor", admission
    assert admission["leaked_buffers"] == 0 and "not compiled" in admission["sentence"], admission
    assert engine["backend"] == "cpu" and engine["state"] == "CPUReady", engine
    assert engine["tier"] is None and engine["features"] == []
    # the warm-up beside the model's load (prepare-gpu) took SwiftShader's device, and no compile
    warm = booted.row.eval("window.webslm.engine.gpuWarmUp")
    assert warm["fallback"] is True and warm["warmed"] is False, warm
    assert "fallback adapter" in warm["reason"] and list(warm["seconds"]) == ["adapter", "device", "destroy"], warm
    assert choice["backend"] == "cpu" and choice["fallback_adapter"] is True, choice
    assert choice["gpu_step_ms"] > choice["cpu_step_ms"] > 0 and choice["skipped"] is None, choice
    assert choice["gpu_steps_timed"] == 0 and choice["gpu_step_finished"] is False and choice["gpu_method"], choice
    assert reason["code"] == "gpu-slower" and reason["stage"] == "step-floor", reason
    assert reason["sentence"].startswith("the GPU here is a software renderer, more than "), reason
    assert "slower than the CPU path" in reason["sentence"] and "?gpu=force" in reason["advice"], reason
    # what the user sees: the badge says CPU, its tooltip and the note say why, the admission line the numbers
    assert _text(booted, "engine-badge") == "CPU"
    assert "software renderer" in _text(booted, "engine-badge", "title")
    note = _text(booted, "engine-note")
    assert note.startswith("The GPU here is a software renderer, ") and "?gpu=force" in note, note
    assert "Not used: a decode step takes more than" in _text(booted, "admission-state")
    assert "before compiling the rest" in _text(booted, "admission-state")
    # and it answers, on the CPU
    answer = booted.row.eval("window.webslm.newChat(), window.webslm.ask(%s, %s)" % (json.dumps(PROMPT), json.dumps(SHORT)),
                             timeout_s=ANSWER_TIMEOUT_S)
    assert answer["backends"] == ["cpu"] and answer["usage"]["completion_tokens"] >= 1, answer
    _record(booted, "default", {"choice": choice, "admission_seconds": admission["seconds"],
                                "page_ready_s": booted.row.eval("window.webslm.timings.page_ready_s"),
                                "cpu_decode_tokens_per_s": answer["timings"]["decode_tokens_per_s"]})


@pytest.mark.last_in_row(3)       # the row's page is left on another site
def test_the_built_site_works_under_a_sub_path(booted, subpath_site_url):
    if booted.row.name != "chromium-compat":
        pytest.skip("one row is enough for the site's URLs: chromium-compat (fast)")
    engine = _open_and_wait(booted, subpath_site_url)
    answer = booted.row.eval("window.webslm.newChat(), window.webslm.ask(%s, %s)" % (json.dumps(PROMPT), json.dumps(SHORT)),
                             timeout_s=ANSWER_TIMEOUT_S)
    worker_urls = booted.request("resource-log")["urls"]
    page_urls = booted.row.requests() or []
    print(f"\n{booted.row.name}: {subpath_site_url} ready on the {engine['backend']}; "
          f"{len(page_urls)} page and {len(worker_urls)} worker requests; {answer['text']!r}")
    assert engine["choice"]["gpu_steps_timed"] >= 1, engine["choice"]       # the default: the GPU timed
    # ANGLE's adapter is no fallback: the warm-up compiled and ran its probe while the model loaded
    assert engine["gpuWarmUp"]["warmed"] is True and engine["gpuWarmUp"]["reason"] == "", engine["gpuWarmUp"]
    assert engine["model"]["source"] == "network", engine["model"]           # a new origin: nothing cached
    assert engine["model"]["url"].startswith(subpath_site_url), engine["model"]
    assert answer["usage"]["completion_tokens"] >= 1 and answer["text"], answer
    assert answer["finish_reason"] in ("stop", "length"), answer
    # the model's download began while the worker was still booting (startLoad, worker.mjs)
    log = booted.request("resource-log")["entries"]
    model_start = next(e["start_ms"] for e in log if e["url"] == engine["model"]["url"])
    assert model_start < engine["worker"]["boot"]["total_ms"], (model_start, engine["worker"]["boot"])
    outside = [u for u in [*page_urls, *worker_urls] if u.startswith("http") and not u.startswith(subpath_site_url)]
    assert outside == [], outside
    assert any(u.endswith("worker/worker.mjs") for u in [*page_urls, *worker_urls]), page_urls
    _record(booted, "sub_path", {"url": subpath_site_url, "backend": engine["backend"], "choice": engine["choice"],
                                 "page_ready_s": booted.row.eval("window.webslm.timings.page_ready_s"),
                                 "completion_tokens": answer["usage"]["completion_tokens"],
                                 "decode_tokens_per_s": answer["timings"]["decode_tokens_per_s"]})


@pytest.fixture(scope="module")
def broken_wheel_site_url(tmp_path_factory):
    """The built site with one byte of its webslm wheel changed: the worker's boot refuses it
    (the manifest's sha256), while the page has already started reading the model."""
    where = tmp_path_factory.mktemp("broken")
    with static_site(ROOT, where) as port:
        assets = where / "www" / "assets"
        wheel = assets / json.loads((assets / "manifest.json").read_text())["webslm"]["wheel"]
        data = bytearray(wheel.read_bytes())
        data[len(data) // 2] ^= 0xFF
        wheel.write_bytes(bytes(data))
        yield f"http://127.0.0.1:{port}/"


@pytest.mark.last_in_row(4)       # the row's page is left on another site
def test_a_worker_that_does_not_boot_is_what_the_page_says_though_the_model_was_being_read(booted, broken_wheel_site_url):
    if booted.row.name != "chromium-compat":
        pytest.skip("the worker refuses the wheel before any browser difference matters: one row, chromium-compat (fast), checks the page says so")
    booted.row.open("about:blank")
    booted.row.open(broken_wheel_site_url)
    booted.wait_for("document.getElementById('header-status').textContent === 'The engine did not start'",
                    timeout_s=READY_TIMEOUT_S)
    assert booted.row.eval("document.getElementById('start').dataset.failed") == ""
    model = booted.row.eval("window.webslm.model")
    assert model["code"] == "worker-failed" and "does not match the manifest" in model["error"], model
    error = _text(booted, "start-error")
    assert "could not start" in error and "does not match the manifest" in error, error
    assert booted.row.eval("window.webslm.ready") is not True
