"""webgpu/adapters.py: which adapter "auto" picks, and the kernel tier of a feature set.
Plain data on fake adapters: no GPU needed."""
import pytest

from webslm.webgpu.adapters import choose_adapter, tier_for


class FakeAdapter:
    def __init__(self, feature_level, is_fallback):
        self.feature_level, self.is_fallback = feature_level, is_fallback

    def summary(self):
        return type("Summary", (), {"is_fallback": self.is_fallback})()


class FakeGpu:
    """Answers each feature level's request with the adapter given for it, else None."""
    def __init__(self, **adapters):
        self.adapters = adapters
        self.requested = []

    async def request_adapter(self, feature_level):
        self.requested.append(feature_level)
        return self.adapters.get(feature_level)


@pytest.mark.parametrize("core, compatibility, chosen", [
    (False, False, "core"),          # a real core adapter wins
    (True, False, "compatibility"),  # software core vs real compatibility: the real one
    (True, True, "core"),            # only fallbacks: core
    (True, None, "core"),
    (None, True, "compatibility"),
    (None, None, None),              # no adapter at all
])
def test_auto_prefers_a_real_adapter(run, core, compatibility, chosen):
    # None: the browser answers that feature level's request with no adapter
    adapters = {level: FakeAdapter(level, is_fallback) for level, is_fallback
                in (("core", core), ("compatibility", compatibility)) if is_fallback is not None}
    adapter = run(choose_adapter(FakeGpu(**adapters), "auto"))
    assert (adapter.feature_level if adapter else None) == chosen


def test_auto_asks_for_compatibility_only_when_core_is_not_real(run):
    gpu = FakeGpu(core=FakeAdapter("core", False), compatibility=FakeAdapter("compatibility", False))
    run(choose_adapter(gpu, "auto"))
    assert gpu.requested == ["core"]


@pytest.mark.parametrize("level", ["core", "compatibility"])
def test_a_named_feature_level_is_taken_as_it_is_even_a_fallback(run, level):
    gpu = FakeGpu(core=FakeAdapter("core", True), compatibility=FakeAdapter("compatibility", True))
    assert run(choose_adapter(gpu, level)).feature_level == level
    assert gpu.requested == [level]


@pytest.mark.parametrize("features, tier", [
    (set(), "A"),
    ({"timestamp-query"}, "A"),
    ({"shader-f16"}, "B"),
    ({"subgroups"}, "C"),
    ({"subgroups", "shader-f16"}, "C"),
])
def test_tier_for(features, tier):
    assert tier_for(frozenset(features)) == tier
