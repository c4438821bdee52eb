"""Every JS module of the page and the worker parses (node --check), so a syntax slip is
caught in seconds here rather than as "worker failed to start" in the browser rows."""
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODULES = sorted([*ROOT.glob("web/*.mjs"), *ROOT.glob("worker/*.mjs")])


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed (it comes with npm, which set-up needs)")
@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_parses(module):
    result = subprocess.run(["node", "--check", str(module)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
