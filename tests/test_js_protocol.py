"""worker/protocol.mjs's validate(), run in node: a request's fields are checked before the
worker acts on it; an optional field (admit's tuning) may be left out, and is checked when
present; unknown and missing required fields are refused with a bad-field error; admit's gpu
mode is one of three."""
import json
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
ADMIT = {"protocol": "webslm/1", "id": 7, "type": "admit", "featureLevel": "auto", "fault": None, "gpu": "force"}


def validate(message: dict) -> dict:
    script = (f'import {{ validate, ProtocolError }} from "{ROOT}/worker/protocol.mjs";\n'
              f"let out;\ntry {{ out = {{ ok: validate({json.dumps(message)}) }}; }}\n"
              "catch (e) { if (!(e instanceof ProtocolError)) throw e; out = { code: e.code, message: e.message }; }\n"
              "console.log(JSON.stringify(out));")
    result = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_admit_without_tuning_takes_the_default():
    got = validate(ADMIT)
    assert got["ok"]["fields"] == {"featureLevel": "auto", "fault": None, "gpu": "force"}


@pytest.mark.parametrize("tuning", ["auto", "later", "force", "later-force", "off"])
def test_admit_with_a_tuning_mode_passes_it_on(tuning):
    assert validate({**ADMIT, "tuning": tuning})["ok"]["fields"]["tuning"] == tuning


@pytest.mark.parametrize("tuning", ["fast", None, 1, ""])
def test_a_bad_tuning_mode_is_refused(tuning):
    got = validate({**ADMIT, "tuning": tuning})
    assert got["code"] == "bad-field" and 'field "tuning" must be auto, later, force, later-force, off' in got["message"]


def test_required_fields_stay_required_and_unknown_ones_refused():
    missing = {k: v for k, v in ADMIT.items() if k != "gpu"}
    assert validate(missing) == {"code": "bad-field", "message": 'admit: missing field "gpu"'}
    assert validate({**ADMIT, "speed": "max"})["code"] == "bad-field"


@pytest.mark.parametrize("gpu", ["measure", "force", "remeasure"])
def test_admit_takes_each_gpu_mode(gpu):
    """remeasure: measure with the earlier visits' verdict forgotten (py/webslm/engine/verdict.py)."""
    assert validate({**ADMIT, "gpu": gpu})["ok"]["fields"]["gpu"] == gpu


@pytest.mark.parametrize("gpu", ["measure-again", True, None, ""])
def test_a_bad_gpu_mode_is_refused(gpu):
    got = validate({**ADMIT, "gpu": gpu})
    assert got["code"] == "bad-field" and 'field "gpu" must be measure, force or remeasure' in got["message"]
