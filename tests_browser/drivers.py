"""One small driver per browser-matrix row, behind one interface.

Rows (see /work/shared/ENVIRONMENT.md for how each was verified):

* ``chromium``        Playwright + system Chromium; WebGPU on SwiftShader (core tier).
* ``chromium-compat`` Same Chromium with ``--use-angle=vulkan --use-webgpu-adapter=opengles``;
                      the page must request the adapter with ``featureLevel: "compatibility"``
                      (Dawn GL ES backend over ANGLE over lavapipe; maxStorageBufferBindingSize 128 MiB).
                      Without featureLevel the same browser silently hands out the SwiftShader
                      core adapter (1 GiB bindings), so always pass ``row.adapter_options``.
* ``firefox``         Playwright's WebDriver-BiDi path + Firefox ESR; WebGPU (wgpu on lavapipe)
                      on the main thread and in workers.  Needs ``python tools/patch_playwright.py``.
* ``webkit``          Selenium + WebKitWebDriver + MiniBrowser (WebKitGTK) under Xvfb; no WebGPU.

Usage::

    row = launch("chromium")
    try:
        row.open("http://127.0.0.1:8000/index.html")
        row.eval("1 + 1")                                   # -> 2
        row.eval("navigator.gpu.requestAdapter(%s).then(a => !!a)" % json.dumps(row.adapter_options))
    finally:
        row.close()

Every row also has ``set_viewport(width, height)`` (the page's ``innerWidth`` x ``innerHeight`` in
CSS pixels), ``screenshot(path)`` (a PNG of the viewport, one image pixel per CSS pixel) and
``clear_requests()`` (so that a test can assert on what a reload fetched).

``eval`` has the same semantics on every row: the expression is evaluated in the page, awaited
if it is a promise (or any thenable), and its value is passed through ``JSON.stringify`` and
decoded in Python (``undefined`` -> ``None``).  A JS exception / rejection (including a value that
JSON cannot encode, and the JS-side timeout) raises :class:`BrowserEvalError` whose message is
``String(error)``, e.g. ``"Error: boom"``, identical on every row.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from process_tree import descendants, kill_tree, own_children, run_with_watchdog, start_xvfb

ROW_NAMES = ["chromium", "chromium-compat", "firefox", "webkit", "playwright-firefox", "playwright-webkit"]

CHROMIUM_BIN = "/usr/bin/chromium"
FIREFOX_BIN = "/usr/bin/firefox-esr"
WEBKIT_DRIVER_BIN = "/usr/bin/WebKitWebDriver"
WEBKIT_MINIBROWSER_BIN = "/usr/lib/x86_64-linux-gnu/webkit2gtk-4.1/MiniBrowser"
XVFB_BIN = "/usr/bin/Xvfb"

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--enable-unsafe-webgpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
CHROMIUM_COMPAT_EXTRA_ARGS = ["--use-angle=vulkan", "--use-webgpu-adapter=opengles"]

# Both are required on ESR 153 (verified): without dom.webgpu.enabled there is no navigator.gpu;
# without gfx.webgpu.ignore-blocklist requestAdapter() resolves to null (lavapipe is blocklisted).
# There is no dom.webgpu.workers.enabled pref in ESR 153: workers get navigator.gpu by default.
FIREFOX_PREFS = {"dom.webgpu.enabled": True, "gfx.webgpu.ignore-blocklist": True}

# Binaries whose absence makes a row unavailable (used by the tests to skip with a reason).
ROW_BINARIES: dict[str, list[str]] = {
    "chromium": [CHROMIUM_BIN],
    "chromium-compat": [CHROMIUM_BIN],
    "firefox": [FIREFOX_BIN],
    "webkit": [WEBKIT_DRIVER_BIN, WEBKIT_MINIBROWSER_BIN],
}

# Must match tools/patch_playwright.py.
_PW_PATCH_MARKER = "/*webslm:tolerate-unknown-command*/"
_PW_PATCH_COMMAND = '"emulation.setMediaFeaturesOverride"'

# extra seconds the driver-side timeout of eval() allows beyond the JS-side one
_DRIVER_TIMEOUT_GRACE_S = 5.0
# and after that many more seconds a Playwright row kills its hung browser
_KILL_GRACE_S = 10.0


class BrowserEvalError(RuntimeError):
    """A JS exception/rejection raised while evaluating an expression in the page."""


class BrowserRowUnavailable(RuntimeError):
    """The row's browser (or its driver) is not installed here."""


def missing_binaries(name: str) -> list[str]:
    """The binaries the row needs that are not present (empty list: the row can run)."""
    if name not in ROW_BINARIES and not name.startswith("playwright-"):
        raise ValueError(f"unknown browser row {name!r}; known: {ROW_NAMES}")
    if name.startswith("playwright-"):
        path = playwright_browser_path(name.removeprefix("playwright-"))
        return [] if os.access(path, os.X_OK) else [f"{path} (Playwright's own build; `playwright install` needs internet)"]
    needed = list(ROW_BINARIES[name])
    if name == "webkit" and not os.environ.get("DISPLAY"):
        needed.append(XVFB_BIN)
    return [b for b in needed if not os.access(b, os.X_OK)]


# --------------------------------------------------------------------------- JS wrapper

def _js_body(expression: str, timeout_s: float) -> str:
    """An async arrow function body, shared by every row, that evaluates ``expression`` and
    resolves to a JSON string ``{"ok": true, "value": ...}`` or ``{"ok": false, "error": ...}``.
    The expression is compiled with ``new Function`` so that a syntax error is reported like
    any other exception instead of breaking the wrapper."""
    expr = expression.strip()
    while expr.endswith(";"):
        expr = expr[:-1].rstrip()
    timeout_ms = max(1, int(timeout_s * 1000))
    source = json.dumps("return (" + expr + "\n);")
    timeout_msg = json.dumps(f"eval timed out after {timeout_s:g} s")
    return (
        "async () => {\n"
        "  let timer;\n"
        "  try {\n"
        f"    const fn = new Function({source});\n"
        "    const v = await Promise.race([\n"
        "      Promise.resolve().then(() => fn()),\n"
        "      new Promise((_, rej) => { timer = setTimeout(() => rej(new Error("
        f"{timeout_msg})), {timeout_ms}); }}),\n"
        "    ]);\n"
        "    return JSON.stringify({ok: true, value: v === undefined ? null : v});\n"
        "  } catch (e) {\n"
        "    let msg;\n"
        "    try { msg = String(e); } catch (_) { msg = Object.prototype.toString.call(e); }\n"
        "    return JSON.stringify({ok: false, error: msg});\n"
        "  } finally { clearTimeout(timer); }\n"
        "}"
    )


def _decode(raw: Any) -> Any:
    if not isinstance(raw, str):
        raise BrowserEvalError(f"driver returned a non-string wrapper result: {raw!r}")
    msg = json.loads(raw)
    if msg.get("ok"):
        return msg.get("value")
    raise BrowserEvalError(msg.get("error", "unknown error"))


# --------------------------------------------------------------------------- interface

class BrowserRow:
    """One browser-matrix row.  Create with :func:`launch`."""

    name: str = ""
    expects_webgpu: bool = True
    # Whether the row's tests run the engine on its GPU (the page opened with ?gpu=force):
    # Firefox and chromium-compat. Not Chromium's SwiftShader, where the engine choice answers
    # on the CPU path, as a user gets it there (py/webslm/engine/choice.py); SwiftShader's
    # WebGPU is still checked by admission (its self-tests) and the kernel golden suite, and
    # the GPU engine in Chromium is chromium-compat's (the same browser over ANGLE).
    engine_on_gpu: bool = False
    adapter_options: dict = {}
    launch_s: float = 0.0  # wall seconds launch() took (browser start + first page ready)

    def open(self, url: str) -> None:
        raise NotImplementedError

    def eval(self, js_expression_returning_promise_or_value: str, timeout_s: float = 60) -> Any:
        raise NotImplementedError

    def console(self) -> list[str]:
        """Console messages seen so far, formatted ``"<type>: <text>"`` (best effort)."""
        return []

    def requests(self) -> list[str] | None:
        """URLs requested by the page and its workers, or ``None`` where the driver cannot see them."""
        return None

    def clear_requests(self) -> None:
        """Forget the URLs that ``requests()`` has recorded so far (nothing to forget where it is ``None``)."""

    def set_viewport(self, width: int, height: int) -> None:
        """Resize the page's viewport to ``width`` x ``height`` CSS pixels."""
        raise NotImplementedError

    def screenshot(self, path: str | os.PathLike) -> None:
        """Write a PNG of what the viewport shows to ``path``."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> "BrowserRow":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


# --------------------------------------------------------------------------- Playwright rows

class _PlaywrightRow(BrowserRow):
    def __init__(self) -> None:
        from playwright.sync_api import sync_playwright

        self._console: list[str] = []
        self._requests: list[str] = []
        self._lock = threading.Lock()
        self._closed = False
        self._killed = False
        before = own_children()
        t0 = time.monotonic()
        self._pw = sync_playwright().start()
        self._pids = sorted(own_children() - before)  # the Playwright node driver
        try:
            self._browser = self._launch_browser(self._pw)
            self._context = self._browser.new_context()
            self._context.on("request", self._on_request)
            self._page = self._context.new_page()
            self._page.on("console", self._on_console)
            self._page.on("pageerror", lambda err: self._log(f"pageerror: {err}"))
        except BaseException:
            self.close()
            raise
        self.launch_s = time.monotonic() - t0

    def _launch_browser(self, pw):  # pragma: no cover - abstract
        raise NotImplementedError

    def _log(self, line: str) -> None:
        with self._lock:
            self._console.append(line)

    def _on_console(self, msg) -> None:
        # Verified on Chromium 156 and Firefox ESR 153 (BiDi): messages from dedicated workers
        # (classic and module) also arrive here; Worker.on("console") would only duplicate them.
        self._log(f"{msg.type}: {msg.text}")

    def _on_request(self, request) -> None:
        with self._lock:
            self._requests.append(request.url)

    def open(self, url: str) -> None:
        self._page.goto(url, wait_until="load", timeout=60_000)

    def eval(self, js_expression_returning_promise_or_value: str, timeout_s: float = 60) -> Any:
        from playwright.sync_api import Error as PlaywrightError

        if self._closed:
            raise BrowserEvalError(f"{self.name}: row is closed")
        body = _js_body(js_expression_returning_promise_or_value, timeout_s)
        # Last resort against a renderer that hangs between the calls below (which have no
        # timeout of their own): kill the browser processes (not the driver), which makes the
        # pending call fail; the row is unusable afterwards.
        guard = threading.Timer(timeout_s + _DRIVER_TIMEOUT_GRACE_S + _KILL_GRACE_S,
                                self._kill_browser)
        guard.daemon = True
        guard.start()
        # wait_for_function instead of evaluate: it calls the function once (its promise is
        # truthy), awaits the promise, and - unlike evaluate - has a driver-side timeout: on
        # Chromium a page whose main thread never yields gives a clean timeout error and the
        # page recovers if it ever yields.  On Firefox (BiDi) that timeout only surfaces once
        # the browser is killed by the guard above (verified: ~timeout_s + 15 s).
        try:
            handle = self._page.wait_for_function(
                body, timeout=(timeout_s + _DRIVER_TIMEOUT_GRACE_S) * 1000, polling=100)
            try:
                raw = handle.json_value()
            finally:
                handle.dispose()
        except PlaywrightError as exc:  # timeout on a blocked page, crash, navigation, driver gone
            note = " (browser killed: page hung)" if self._killed else ""
            raise BrowserEvalError(f"driver error: {exc.message}{note}") from exc
        finally:
            guard.cancel()
        return _decode(raw)

    def _kill_browser(self) -> None:
        self._killed = True
        for pid in self._pids:
            kill_tree(descendants(pid))

    def console(self) -> list[str]:
        with self._lock:
            return list(self._console)

    def requests(self) -> list[str] | None:
        with self._lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def set_viewport(self, width: int, height: int) -> None:
        self._page.set_viewport_size({"width": width, "height": height})

    def screenshot(self, path: str | os.PathLike) -> None:
        self._page.screenshot(path=str(path))  # the viewport, not the full page

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        steps = []
        for attr in ("_context", "_browser"):
            obj = getattr(self, attr, None)
            if obj is not None:
                steps.append(obj.close)
        steps.append(self._pw.stop)
        run_with_watchdog(steps, self._pids)


class ChromiumRow(_PlaywrightRow):
    name = "chromium"
    expects_webgpu = True
    engine_on_gpu = False
    adapter_options: dict = {}
    extra_args: list[str] = []

    def __init__(self) -> None:
        self.adapter_options = dict(type(self).adapter_options)
        super().__init__()

    def _launch_browser(self, pw):
        return pw.chromium.launch(
            executable_path=CHROMIUM_BIN,
            args=CHROMIUM_ARGS + self.extra_args,
            headless=True,
            timeout=120_000,
        )


class ChromiumCompatRow(ChromiumRow):
    name = "chromium-compat"
    engine_on_gpu = True
    adapter_options = {"featureLevel": "compatibility"}
    extra_args = CHROMIUM_COMPAT_EXTRA_ARGS


def playwright_firefox_patched() -> bool:
    """True if the installed Playwright does not need (or already has) tools/patch_playwright.py."""
    import playwright

    bundle = Path(playwright.__file__).resolve().parent / "driver/package/lib/coreBundle.js"
    text = bundle.read_text(encoding="utf-8")
    return text.count(_PW_PATCH_COMMAND) == text.count(_PW_PATCH_MARKER)


class FirefoxRow(_PlaywrightRow):
    name = "firefox"
    expects_webgpu = True
    engine_on_gpu = True
    adapter_options: dict = {}

    def __init__(self) -> None:
        self.adapter_options = {}
        if not playwright_firefox_patched():
            raise RuntimeError(
                "the installed Playwright sends emulation.setMediaFeaturesOverride, which Firefox "
                "ESR rejects; run `python tools/patch_playwright.py` once in this venv")
        super().__init__()

    def _launch_browser(self, pw):
        return pw.firefox.launch(
            channel="moz-firefox",
            executable_path=FIREFOX_BIN,
            headless=True,
            firefox_user_prefs=dict(FIREFOX_PREFS),
            timeout=120_000,
        )


# --------------------------------------------------------------------------- WebKit (Selenium)

_CONSOLE_HOOK_JS = r"""
if (!window.__webslmConsole) {
  window.__webslmConsole = [];
  for (const t of ['log', 'info', 'warn', 'error', 'debug']) {
    const orig = console[t];
    console[t] = function (...a) {
      try { window.__webslmConsole.push((t === 'warn' ? 'warning' : t) + ': ' + a.map(String).join(' ')); } catch (_) {}
      return orig.apply(this, a);
    };
  }
  window.addEventListener('error', (e) => window.__webslmConsole.push('pageerror: ' + e.message));
}
"""


# MiniBrowser's toolbar (back, forward, reload, the URL entry, ...) keeps its GTK window at least
# 447 px wide, too wide for a phone-sized viewport.  This user style sheet (GTK 3 reads it from
# $XDG_CONFIG_HOME/gtk-3.0/gtk.css) lets the buttons and the entry shrink: the window then goes
# down to 305 px.  It styles MiniBrowser's own widgets only; WebKit draws the page's form controls
# itself.
_MINIBROWSER_GTK_CSS = "button, entry { min-width: 0; padding-left: 0; padding-right: 0; }\n"


class WebKitRow(BrowserRow):
    """Selenium + WebKitWebDriver + MiniBrowser.  ``console()`` is a best-effort in-page hook
    (main-thread messages logged after ``open()`` returned; WebKitWebDriver has no log API);
    ``requests()`` is ``None``.  WebDriver can only size the window, so ``set_viewport`` sizes
    it to the viewport plus MiniBrowser's toolbar (see _MINIBROWSER_GTK_CSS for how narrow)."""

    name = "webkit"
    expects_webgpu = False
    adapter_options: dict = {}

    def __init__(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.webkitgtk.service import Service

        self.adapter_options = {}
        self._closed = False
        self._xvfb: subprocess.Popen | None = None
        self._driver = None
        self._service = None
        self._pids: list[int] = []
        self._console_cache: list[str] = []
        self._gtk_config = tempfile.TemporaryDirectory(prefix="webslm-minibrowser-")
        t0 = time.monotonic()
        env = dict(os.environ)
        try:
            css = Path(self._gtk_config.name, "gtk-3.0", "gtk.css")
            css.parent.mkdir()
            css.write_text(_MINIBROWSER_GTK_CSS)
            env["XDG_CONFIG_HOME"] = self._gtk_config.name
            if not env.get("DISPLAY"):
                if not os.access(XVFB_BIN, os.X_OK):
                    raise BrowserRowUnavailable(f"{XVFB_BIN} is needed for the webkit row when DISPLAY is unset")
                self._xvfb, display = start_xvfb(XVFB_BIN)
                self._pids.append(self._xvfb.pid)
                env["DISPLAY"] = display
            env.pop("WAYLAND_DISPLAY", None)
            opts = webdriver.WebKitGTKOptions()
            opts.binary_location = WEBKIT_MINIBROWSER_BIN
            opts.add_argument("--automation")
            self._service = Service(executable_path=WEBKIT_DRIVER_BIN, env=env,
                                    log_output=subprocess.DEVNULL)
            before = own_children()
            try:
                self._driver = webdriver.WebKitGTK(options=opts, service=self._service)
            finally:
                self._pids.extend(sorted(own_children() - before - set(self._pids)))
            self._driver.set_page_load_timeout(60)
        except BaseException:
            self.close()
            raise
        self.launch_s = time.monotonic() - t0

    def open(self, url: str) -> None:
        self._console_cache = self.console()
        self._driver.get(url)
        try:
            self._driver.execute_script(_CONSOLE_HOOK_JS)
        except Exception:  # noqa: BLE001 - best effort
            pass

    def eval(self, js_expression_returning_promise_or_value: str, timeout_s: float = 60) -> Any:
        from selenium.common.exceptions import WebDriverException

        body = _js_body(js_expression_returning_promise_or_value, timeout_s)
        script = f"const __done = arguments[arguments.length - 1];\n({body})().then(__done);"
        self._driver.set_script_timeout(timeout_s + _DRIVER_TIMEOUT_GRACE_S)
        try:
            raw = self._driver.execute_async_script(script)
        except WebDriverException as exc:
            raise BrowserEvalError(f"driver error: {exc.msg}") from exc
        return _decode(raw)

    def console(self) -> list[str]:
        if self._driver is None or self._closed:
            return list(self._console_cache)
        try:
            live = self._driver.execute_script("return window.__webslmConsole || [];") or []
        except Exception:  # noqa: BLE001
            live = []
        return list(self._console_cache) + [str(x) for x in live]

    def requests(self) -> list[str] | None:
        return None

    def set_viewport(self, width: int, height: int) -> None:
        # The window is the viewport plus MiniBrowser's toolbar; the page knows both sizes.
        # Narrower than the window can go (see _MINIBROWSER_GTK_CSS), the viewport stays wider.
        chrome_w, chrome_h = self.eval("[outerWidth - innerWidth, outerHeight - innerHeight]")
        self._driver.set_window_size(width + chrome_w, height + chrome_h)
        # The page reports the new size at once but paints it later: a screenshot taken now would
        # show the old layout, cut or padded with black.  Two frames later it is on screen.
        self.eval("new Promise(ok => requestAnimationFrame(() => requestAnimationFrame(() => ok(true))))")

    def screenshot(self, path: str | os.PathLike) -> None:
        # WebDriver's screenshot of the top-level page is what the viewport shows.
        Path(path).write_bytes(self._driver.get_screenshot_as_png())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        steps = []
        if self._driver is not None:
            steps.append(self._driver.quit)
        elif self._service is not None:
            steps.append(self._service.stop)
        if self._xvfb is not None:
            xvfb = self._xvfb

            def stop_xvfb() -> None:
                xvfb.terminate()
                try:
                    xvfb.wait(5)
                except subprocess.TimeoutExpired:
                    xvfb.kill()
                    xvfb.wait(5)

            steps.append(stop_xvfb)
        steps.append(self._gtk_config.cleanup)
        run_with_watchdog(steps, self._pids)


# --------------------------------------------------------------------------- factory

# ------------------------------------------------------- Playwright's own browser builds
# On a machine with internet, `playwright install firefox webkit` downloads Playwright's own
# builds; where they are present the same tests run on them too. Whether they expose WebGPU
# depends on the build and the OS, so these rows record the outcome instead of expecting one
# (expects_webgpu None): an adapter, if any, must still pass the kernel check.

_playwright_paths: dict[str, str] = {}


def playwright_browser_path(browser: str) -> str:
    """Where Playwright's own build of `browser` would be (it may not be installed)."""
    if browser not in _playwright_paths:
        from playwright.sync_api import sync_playwright
        with sync_playwright() as pw:
            _playwright_paths.update(firefox=pw.firefox.executable_path, webkit=pw.webkit.executable_path)
    return _playwright_paths[browser]


class PlaywrightFirefoxRow(_PlaywrightRow):
    name = "playwright-firefox"
    expects_webgpu = None
    adapter_options: dict = {}

    def _launch_browser(self, pw):
        return pw.firefox.launch(headless=True, firefox_user_prefs=dict(FIREFOX_PREFS), timeout=120_000)


class PlaywrightWebKitRow(_PlaywrightRow):
    name = "playwright-webkit"
    expects_webgpu = None
    adapter_options: dict = {}

    def _launch_browser(self, pw):
        return pw.webkit.launch(headless=True, timeout=120_000)


_ROW_CLASSES = {
    "chromium": ChromiumRow,
    "chromium-compat": ChromiumCompatRow,
    "firefox": FirefoxRow,
    "webkit": WebKitRow,
    "playwright-firefox": PlaywrightFirefoxRow,
    "playwright-webkit": PlaywrightWebKitRow,
}


def launch_or_skip(name: str) -> BrowserRow:
    """launch(), or skip the calling pytest test with the missing binaries named."""
    import pytest

    missing = missing_binaries(name)
    if missing:
        how = "" if name.startswith("playwright-") else " (./dev test installs them as root)"
        pytest.skip(f"{name}: not installed: {', '.join(missing)}{how}")
    return launch(name)


def launch(name: str) -> BrowserRow:
    """Start the browser for row ``name`` (one of ROW_NAMES) with a blank page ready."""
    if name not in _ROW_CLASSES:
        raise ValueError(f"unknown browser row {name!r}; known: {ROW_NAMES}")
    missing = missing_binaries(name)
    if missing:
        raise BrowserRowUnavailable(f"row {name!r} needs {', '.join(missing)} (not found)")
    return _ROW_CLASSES[name]()


__all__ = [
    "ROW_NAMES", "BrowserRow", "BrowserEvalError", "BrowserRowUnavailable", "launch", "launch_or_skip",
    "missing_binaries", "playwright_firefox_patched",
]
