"""Fixtures for the browser matrix: the served app, and one booted worker per engine row.

The rows use the site as users deploy it: `python serve.py --build DIR` once per session, served
by plain `python -m http.server`. Each row reaches that server through its own OfflineProxy, so
each row is its own origin (its own HTTP cache, Cache Storage and service worker) and a test can
take its row offline (`booted.proxy.offline = True`) without touching the other rows.

Each row's browser is launched once per session and the app page opened once; every test
of that row talks to that one booted worker. Measurements (boot times, adapter features
and limits, kernel results) are printed and written to tests_browser/results/<row>.json.
`app_url` serves the working tree through serve.py's own server, for tests of that server.
"""
from __future__ import annotations

import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import drivers  # noqa: E402
import serve  # noqa: E402
from app_session import BootedRow, serve_in_thread, static_site  # noqa: E402
from offline_proxy import OfflineProxy  # noqa: E402


def _require_assets():
    if not (ROOT / serve.MANIFEST).is_file():
        pytest.fail("assets missing: run `python tools/assets.py` (./dev test does)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "last_in_row(rank=0): run after the row's other tests, lower ranks first (tests that "
        "leave the engine on the CPU path, so that no GPU test after them has to admit the model again)")
    config.addinivalue_line(
        "markers", "first_in_row: run before the row's other tests (a test that checks the page as the "
        "row's boot left it, before any other test changes it)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """Within each row (the run of tests that share one `booted` browser, as pytest groups
    them), tests marked first_in_row go to the start and tests marked last_in_row to the end,
    by rank, else in their order. The last ones leave the engine on the CPU path (a fault
    admission, a lost device); a GPU test after them would first admit the model again: about
    a minute on SwiftShader, for nothing it checks. The first ones read the page as it booted,
    so they need not open it again."""
    def row(item):
        callspec = getattr(item, "callspec", None)
        return callspec.params.get("booted") if callspec else None

    def rank(item):
        marker = item.get_closest_marker("last_in_row")
        return marker.args[0] if marker.args else 0

    ordered, start = [], 0
    for end in range(1, len(items) + 1):
        if end == len(items) or row(items[end]) != row(items[start]):
            run = items[start:end]
            if row(items[start]) is None:
                ordered += run
            else:
                ordered += [i for i in run if i.get_closest_marker("first_in_row")]
                ordered += [i for i in run if not i.get_closest_marker("last_in_row")
                            and not i.get_closest_marker("first_in_row")]
                ordered += sorted((i for i in run if i.get_closest_marker("last_in_row")), key=rank)
            start = end
    items[:] = ordered


@pytest.fixture(scope="session")
def app_url():
    """The working tree served by serve.py's own server (the dev server)."""
    _require_assets()
    server, url = serve_in_thread(serve.url_map(ROOT))
    yield url
    server.shutdown()


@pytest.fixture(scope="session")
def site_port(tmp_path_factory):
    """`serve.py --build` output, served by plain `python -m http.server`: its port."""
    _require_assets()
    with static_site(ROOT, tmp_path_factory.mktemp("site")) as port:
        yield port


@pytest.fixture(scope="session")
def built_site_url(site_port):
    """The built site, straight from its http.server (no proxy)."""
    return f"http://127.0.0.1:{site_port}/"


@pytest.fixture(scope="session")
def subpath_site_url(tmp_path_factory):
    """`serve.py --build` output under a sub-path (/app/ of a plain `python -m http.server`), as
    a static host serves a site that is not at its root: the page's URL."""
    _require_assets()
    with static_site(ROOT, tmp_path_factory.mktemp("subpath"), path="app") as port:
        yield f"http://127.0.0.1:{port}/app/"


# The page of a row whose engine tests run on its GPU (drivers.BrowserRow.engine_on_gpu:
# Firefox, chromium-compat) keeps the admitted GPU untimed (?gpu=force): every GPU here is a
# software one, slower than the CPU path, so by default the page would answer on the CPU
# (test_engine_choice_browser.py checks that default), and those tests are about the GPU.
# Chromium's SwiftShader row opens the page as a user does.
GPU_ROW_QUERY = "?gpu=force"


@pytest.fixture(scope="session", params=drivers.ROW_NAMES)
def booted(request, site_port):
    """One row's browser with the built site open (with GPU_ROW_QUERY where engine_on_gpu), through the
    row's own OfflineProxy, and its worker booted."""
    row = drivers.launch_or_skip(request.param)
    proxy = OfflineProxy(site_port)
    try:
        query = GPU_ROW_QUERY if row.engine_on_gpu else ""
        yield BootedRow(row, proxy.url, results_dir=HERE / "results", proxy=proxy, query=query, photograph_start=True)
    finally:
        try:
            row.close()
        finally:
            proxy.close()


@pytest.fixture(autouse=True)
def _row_back_online(request):
    """A test that takes its row offline and fails before putting it back must not take the
    row's later tests down with it."""
    booted = request.getfixturevalue("booted") if "booted" in request.fixturenames else None
    yield
    if booted is not None:
        booted.proxy.offline = False


GREEDY_PROMPT = "What is the capital of France?"
GREEDY_MAX_TOKENS = 16


@pytest.fixture(scope="session")
def cpu_reference() -> dict:
    """The greedy CPU-only answer to GREEDY_PROMPT (chat-templated, no system prompt, at most
    GREEDY_MAX_TOKENS), computed here in CPython: the sampler and the CPU engine are
    bit-identical to the worker's (tests_browser/test_app.py checks the sampler), so every
    engine in every row must give exactly this text and these token ids."""
    import json

    import webslm
    from webslm.cpu import CpuBackend
    from webslm.generate import generate, prompt_ids
    from webslm.semantic.ledger import Ledger
    entry = next(m for m in json.loads((ROOT / serve.MANIFEST).read_text())["models"] if m["default"])
    model = webslm.open_model(ROOT / ".assets/site" / entry["file"])
    ledger = Ledger()
    settings = webslm.SamplerSettings(temperature=0, max_tokens=GREEDY_MAX_TOKENS)
    text = "".join(d.text for d in generate(model, CpuBackend(model), prompt_ids(model, GREEDY_PROMPT, chat=True),
                                            settings, ledger=ledger))
    return {"text": text, "token_ids": list(ledger.committed_ids)}

