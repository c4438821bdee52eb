"""The tuning results kept across visits (worker/tuning-store.mjs): an admission that measured
something writes the worker's tuning cache to Cache Storage; the page opened again (a new
worker, the same browser profile) reads it back before admitting, and those forms are taken
unmeasured; with tuning "later", what is left is measured after the admission's reply, once
the engine is idle (AdmissionPolicy.tune_later). In chromium-compat only: its GPU (lavapipe) is a software adapter, where the
tuning stage measures only when asked (admit's `tuning: "force"`, and "later-force" for
"later": plain "later" keeps the rule there at once), and one row is enough for
what is the same code in every browser. The test leaves the row as it found it: the kept
cache deleted and the page opened again (a fresh worker, no cache in memory), so later tests
admit on the host's rules."""
from __future__ import annotations

import pytest

STORE = "caches.open('webslm-tuning-v1').then((c) => c.match(new URL('/.webslm-tuning/tuning.json', location.origin).href))"
ADMIT = {"featureLevel": "auto", "fault": None, "gpu": "force", "tuning": "force"}
LATER = {**ADMIT, "tuning": "later-force"}   # kept results now, the rest once the engine is idle
TIMEOUT_S = 900


def _kept_entries(booted) -> int | None:
    return booted.row.eval(f"{STORE}.then((r) => r ? r.text().then((t) => Object.keys(JSON.parse(t)).length) : null)")


def test_a_second_visit_takes_the_tuning_results_kept_by_the_first(booted):
    if booted.row.name != "chromium-compat":
        pytest.skip("one row is enough: the store is the same code in every browser (module docstring)")
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=TIMEOUT_S)
    try:
        assert _kept_entries(booted) is None                 # the row's own admissions measured nothing
        first = booted.request("admit", ADMIT, timeout_s=TIMEOUT_S)
        assert first["admitted"] and first["tuning"]["source"] == "measured", first["tuning"]
        assert first["tuning_new_entries"] >= 1 and first["tuning_kept"] is True, first
        assert _kept_entries(booted) == first["tuning_new_entries"]

        booted.reload("tuning-store")                        # a new worker: nothing in its memory
        booted.wait_for("window.webslm && window.webslm.ready", timeout_s=TIMEOUT_S)
        booted.row.eval("(window.__tuning = [], window.webslm.client.addEventListener('engine-tuning', "
                        "(e) => window.__tuning.push(e.detail)), true)")
        second = booted.request("admit", LATER, timeout_s=TIMEOUT_S)
        assert second["admitted"], second
        # every result kept is taken unmeasured; the forms the first admission's budget cut
        # short (not kept) are left for when the engine is idle (tuning "later-force": tune_later)
        assert second["tuning"]["cached"] == first["tuning_new_entries"], (first["tuning"], second["tuning"])
        assert second["tuning"]["source"] in ("cached", "deferred"), second["tuning"]
        later = None
        if second["tuning"]["source"] == "deferred":         # the worker measures them after the reply
            later = booted.wait_for("window.__tuning.length > 0 && window.__tuning[0]", timeout_s=TIMEOUT_S)
            assert later["source"] in ("measured", "rule", "cached"), later
        assert _kept_entries(booted) >= first["tuning_new_entries"]
        booted.record(tuning_store={"first": first["tuning"], "second": second["tuning"], "later": later,
                                    "kept": first["tuning_new_entries"]})
    finally:
        booted.row.eval("caches.delete('webslm-tuning-v1')")
        booted.reload("after-tuning-store")
        booted.wait_for("window.webslm && window.webslm.ready", timeout_s=TIMEOUT_S)
