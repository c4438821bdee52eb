"""A model whose chat template is hostile, loaded into the page (as a `?model=` link could):
each answer request ends in a typed error reply ("bad-field", the message naming
bad-template), and the worker answers the next request at once. The time to the error
reply is printed, not asserted (tests time nothing): docs/RESULTS.md reports it.
Chromium, the dev server, the CPU path (?gpu=0): seconds, not minutes."""
from __future__ import annotations

import base64
import json
import pathlib
import sys
import tempfile

import pytest

import drivers

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import slm_surgery as surgery  # noqa: E402

TEMPLATES = {
    "gigabyte %-padding": "{{ '%(a)999999999s' % {'a': 1} }}",
    "a count over 4M characters, 100,000 times": "{% set s = 'a' * 3999999 %}{% for i in range(100000) %}"
                                                 "{{ s.count('b') and '' }}{% endfor %}",
    "tojson of 10,000 items, 100,000 times": "{% set v = range(10000)|list %}{% for i in range(100000) %}"
                                             "{% set t = v|tojson %}{% endfor %}",
}

ANSWER = """(async () => {
  const client = window.webslm.client;
  const bytes = Uint8Array.from(atob(%s), (c) => c.charCodeAt(0));
  await client.request("load-model", {source: {file: new Blob([bytes])}, sha256: null, name: "hostile", cache: false});
  const started = performance.now();
  let reply;
  try {
    reply = {result: await client.request("generate", {messages: [{role: "user", content: "Hi"}], settings: {max_tokens: 4}})};
  } catch (error) {
    reply = {code: error.code, message: error.message};
  }
  reply.ms = performance.now() - started;
  const pinged = performance.now();
  reply.ping = await client.request("ping");
  reply.ping_ms = performance.now() - pinged;
  return reply;
})()"""


def hostile_model(template: str) -> bytes:
    from webslm.fixture import make_fixture
    with tempfile.TemporaryDirectory() as tmp:
        make_fixture(f"{tmp}/fixture.slm")
        pieces = surgery.split(pathlib.Path(f"{tmp}/fixture.slm").read_bytes())
    pieces.manifest["chat_template"]["template"] = template
    return surgery.join(pieces)


@pytest.mark.skipif(bool(drivers.missing_binaries("chromium")), reason="Chromium not installed (/usr/bin/chromium)")
def test_a_hostile_template_ends_in_a_typed_error_and_the_worker_answers_on(app_url):
    row = drivers.launch("chromium")
    try:
        row.open(app_url + "?gpu=0")
        row.eval("new Promise((ok, fail) => { const t = setInterval(() => { if (window.webslm && window.webslm.ready) "
                 "{ clearInterval(t); ok(true); } }, 50); setTimeout(() => fail(new Error('page not ready')), 240000); })",
                 timeout_s=260)
        for name, template in TEMPLATES.items():
            payload = json.dumps(base64.b64encode(hostile_model(template)).decode())
            reply = row.eval(ANSWER % payload, timeout_s=120)
            print(f"{name}: {reply.get('code')} after {reply['ms']:.0f} ms; ping {reply['ping_ms']:.0f} ms")
            assert reply.get("code") == "bad-field" and "bad-template" in reply["message"], reply
            assert reply["ping"] == {"pong": True}
    finally:
        row.close()
