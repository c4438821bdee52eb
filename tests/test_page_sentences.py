"""web/ui-engine.mjs's sentence(), run in node: the worker's and Python's messages become the
page's sentences (a capital letter, a full stop) without turning a URL, a path or a name from
code into something else ("Http://…", "Load-model:")."""
import json
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")

CASES = {
    "the GPU was lost": "The GPU was lost.",
    "this is not a .slm file": "This is not a .slm file.",
    "don't stop": "Don't stop.",
    "prompt: too long": "Prompt: too long.",
    "Already a sentence!": "Already a sentence!",
    "http://127.0.0.1:8000/m.slm: HTTP 404": "http://127.0.0.1:8000/m.slm: HTTP 404.",
    "https://example.org/a.slm could not be read": "https://example.org/a.slm could not be read.",
    "assets/models/x.slm: HTTP 404": "assets/models/x.slm: HTTP 404.",
    "load-model: cancelled by unload": "load-model: cancelled by unload.",
    "max_tokens must be at least 1": "max_tokens must be at least 1.",
    "  the download of https://e.org/m.slm failed: HTTP 500  ": "The download of https://e.org/m.slm failed: HTTP 500.",
}


def test_messages_become_sentences_and_urls_stay_as_they_are():
    script = (f'import {{ sentence }} from "{ROOT}/web/ui-engine.mjs";\n'
              f"console.log(JSON.stringify({json.dumps(list(CASES))}.map(sentence)));")
    result = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert dict(zip(CASES, json.loads(result.stdout))) == CASES
