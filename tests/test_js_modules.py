"""Every JS module of the page and the worker parses (node --check), so a syntax slip is
caught in seconds here rather than as "worker failed to start" in the browser rows; and the
service worker's offline copy names every one of them."""
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODULES = sorted([*ROOT.glob("web/*.mjs"), *ROOT.glob("web/*.js"), *ROOT.glob("worker/*.mjs")])


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed (it comes with npm, which set-up needs)")
@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_parses(module):
    result = subprocess.run(["node", "--check", str(module)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_offline_copy_names_every_file_of_the_page_and_the_worker():
    """web/sw.js's SHELL must list each file of web/ and worker/ (paths relative to the site
    root, where web/ is served): a file missing there is missing offline."""
    shell_source = re.search(r"const SHELL = \[(.*?)\];", (ROOT / "web/sw.js").read_text(), re.S).group(1)
    shell = set(re.findall(r'"([^"]+)"', shell_source))
    files = {p.name for p in (ROOT / "web").iterdir() if p.is_file()}
    files |= {f"worker/{p.name}" for p in (ROOT / "worker").iterdir() if p.is_file()}
    assert files - shell == set(), "add these to SHELL in web/sw.js"
    assert shell - files - {"./"} == set(), "SHELL names files that do not exist"
