"""Conformance (engine/conformance.py) and the engine's CLI: `webslm conformance` and
`webslm generate` through the Engine, on the fixture model."""
from __future__ import annotations

import json
import sys

import pytest

import webslm
from webslm.backends.cpu_path import CpuPath
from webslm.cli import main
from webslm.engine.conformance import MARGIN_TOLERANCE, conformance
from webslm.generate import prompt_ids
from webslm.semantic.sampler import SamplerSettings

from test_engine import GREEDY, FakeGpuBackend, reference


@pytest.fixture(scope="module")
def model(fixture_slm):
    return webslm.open_model(fixture_slm)


@pytest.fixture(scope="module")
def ids(model):
    return prompt_ids(model, "hi", chat=True)


def test_the_cpu_path_agrees_with_the_cpu_oracle_exactly(model, ids, run):
    report = run(conformance(model, CpuPath(model), ids))
    room = model.architecture.context_length - len(ids)
    assert report["positions"] == room < report["tokens_requested"] == 128    # capped by the context
    assert report["top1_agreement"] == 1.0 and report["disagreements"] == []
    assert report["max_abs_logit_error"] == 0.0 and report["passed"]
    assert report["backend"] == "cpu" and report["margin_tolerance"] == MARGIN_TOLERANCE
    rows = report["per_position"]
    assert [r["position"] for r in rows] == list(range(len(ids), len(ids) + room))
    assert all(r["agree"] and r["margin"] >= 0 and r["max_abs_error"] == 0 for r in rows)


def test_the_oracle_is_teacher_forced_greedy_and_ignores_eos(model, ids, run):
    report = run(conformance(model, CpuPath(model), ids, tokens=20))
    forced = [r["oracle_token"] for r in report["per_position"]]
    plain = reference(model, ids, GREEDY).ids
    assert report["positions"] == 20 and tuple(forced) == plain[:20]


def test_a_noisy_device_shows_its_error(model, ids, run):
    report = run(conformance(model, FakeGpuBackend(model, noise=1e-3, yields=0), ids, tokens=16))
    assert 0 < report["max_abs_logit_error"] < 1e-2
    assert report["backend"] == "gpu" and report["positions"] == 16
    for d in report["disagreements"]:          # only where the oracle is nearly tied
        assert d["margin"] < MARGIN_TOLERANCE
    assert report["passed"]


def test_a_wrong_device_fails_and_the_tolerance_decides(model, ids, run):
    report = run(conformance(model, FakeGpuBackend(model, noise=2.0, yields=0), ids, tokens=16))
    assert report["disagreements"] and not report["passed"]
    assert report["top1_agreement"] < 1.0
    widest = max(d["margin"] for d in report["disagreements"])
    lenient = run(conformance(model, FakeGpuBackend(model, noise=2.0, yields=0), ids, tokens=16,
                              margin_tolerance=widest + 1))
    assert lenient["passed"] and lenient["disagreements"] == report["disagreements"]


def test_conformance_needs_room_after_the_prompt(model, ids, run):
    with pytest.raises(ValueError):
        run(conformance(model, CpuPath(model), []))
    with pytest.raises(ValueError):
        run(conformance(model, CpuPath(model), (ids * 8)[: model.architecture.context_length]))


# -- the CLI -------------------------------------------------------------------------------------

def test_cli_conformance_cpu_json(fixture_slm_path, capsys):
    assert main(["conformance", "--model", str(fixture_slm_path), "--backend", "cpu",
                 "--tokens", "12", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["positions"] == 12 and report["top1_agreement"] == 1.0
    assert report["max_abs_logit_error"] == 0.0 and report["passed"]


def test_cli_conformance_cpu_text(fixture_slm_path, capsys):
    assert main(["conformance", "--model", str(fixture_slm_path), "--backend", "cpu", "--tokens", "8",
                 "--prompt", "hello"]) == 0
    out = capsys.readouterr().out
    assert "top-1 agreement 100.0%" in out and out.rstrip().splitlines()[-1].startswith("passed")


def test_cli_conformance_native_without_the_executor_exits_2(fixture_slm_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "webslm.backends.gpu", None)        # import fails
    assert main(["conformance", "--model", str(fixture_slm_path), "--backend", "native", "--json"]) == 2
    assert "GPU executor is not available" in capsys.readouterr().err


def test_cli_generate_cpu_json_streams_through_the_engine(fixture_slm_path, model, capsys):
    assert main(["generate", "--model", str(fixture_slm_path), "--prompt", "hi", "--chat", "--greedy",
                 "--max-tokens", "12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ids = prompt_ids(model, "hi", chat=True)
    g = model.manifest.generation              # --greedy keeps the model's other defaults
    settings = SamplerSettings(temperature=0.0, top_k=g["top_k"], top_p=g["top_p"], min_p=g["min_p"],
                               repetition_penalty=g["repetition_penalty"], max_tokens=12)
    expected = reference(model, ids, settings)
    assert out["prompt_ids"] == ids and tuple(out["token_ids"]) == expected.ids
    assert out["text"] == "".join(d.text for d in expected.deltas)
    assert out["finish_reason"] == expected.finish and out["backend"] == "cpu"
    assert set(out["timings"]) >= {"prompt_tokens", "generated_tokens", "prefill_seconds", "decode_seconds",
                                   "prefill_tokens_per_s", "decode_tokens_per_s"}
    states = [(e["from"], e["to"]) for e in out["events"] if e["event"] == "state"]
    assert states == [("Empty", "CPUReady"), ("CPUReady", "CPUGenerating"), ("CPUGenerating", "CPUReady"),
                      ("CPUReady", "Destroying"), ("Destroying", "Empty")]


def test_cli_generate_native_falls_back_to_the_cpu_with_the_reason(fixture_slm_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "webslm.backends.gpu", None)
    assert main(["generate", "--model", str(fixture_slm_path), "--prompt", "hi", "--greedy",
                 "--max-tokens", "4", "--backend", "native", "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["backend"] == "cpu" and len(out["token_ids"]) <= 4
    fallback = [e for e in out["events"] if e.get("to") == "CPUReady"][0]
    assert fallback["code"] in ("gpu-backend-unavailable", "no-webgpu")
    assert "on the CPU path" in captured.err


def test_cli_generate_plain_text(fixture_slm_path, capsys):
    assert main(["generate", "--model", str(fixture_slm_path), "--prompt", "hi", "--greedy",
                 "--max-tokens", "3"]) == 0
    assert capsys.readouterr().out.endswith("\n")
