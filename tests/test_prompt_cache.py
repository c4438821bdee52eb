"""engine/prompt_cache.py: what a backend's KV cache holds, and how much of it a prompt keeps."""
from __future__ import annotations

import pytest

from webslm.engine.prompt_cache import PromptCache, common_prefix


class Cache:
    """A backend as the record sees it: a position, and nothing else."""

    def __init__(self, position: int = 0):
        self.position = position


@pytest.mark.parametrize("a, b, n", [
    ([], [], 0), ([1, 2], [], 0), ([1, 2, 3], [1, 2, 3], 3), ([1, 2, 3], [1, 2, 3, 4], 3),
    ([1, 2, 3, 4], [1, 2], 2), ([1, 9, 3], [1, 2, 3], 1), ([5], [6], 0),
])
def test_common_prefix(a, b, n):
    assert common_prefix(a, b) == n == common_prefix(b, a)


def test_a_prompt_keeps_the_shared_prefix_but_never_its_last_token():
    cache, backend = PromptCache(), Cache()
    backend.position = 6
    cache.wrote(backend, 0, [1, 2, 3, 4, 5, 6])
    assert cache.ids == [1, 2, 3, 4, 5, 6]
    assert cache.reusable(backend, [1, 2, 3, 4, 5, 6, 7, 8]) == 6      # an exact extension
    assert cache.reusable(backend, [1, 2, 3, 9, 9]) == 3               # a re-rendered tail
    assert cache.reusable(backend, [1, 2, 3, 4, 5, 6]) == 5            # the same prompt: the last token runs again
    assert cache.reusable(backend, [1, 2, 3]) == 2                     # a shorter one
    assert cache.reusable(backend, [7, 1, 2]) == 0                     # a changed system prompt at the start
    assert cache.reusable(backend, [1]) == 0


def test_the_record_follows_what_each_call_wrote():
    cache, backend = PromptCache(), Cache()
    backend.position = 4
    cache.wrote(backend, 0, [1, 2, 3, 4])                  # a prefill
    backend.position = 5
    cache.wrote(backend, 4, [7])                           # a decode step
    assert cache.ids == [1, 2, 3, 4, 7]
    backend.position = 2 + 3
    cache.wrote(backend, 2, [8, 8, 8, 8, 8])               # truncated to 2, a prefill cancelled after 3 of 5
    assert cache.ids == [1, 2, 8, 8, 8]
    backend.position = 2
    cache.wrote(backend, 2, [9, 9])                        # a call that wrote nothing (cancelled first)
    assert cache.ids == [1, 2]


def test_the_record_is_dropped_when_it_no_longer_describes_the_cache():
    cache, gpu, cpu = PromptCache(), Cache(3), Cache(0)
    cache.wrote(gpu, 0, [1, 2, 3])
    assert cache.reusable(cpu, [1, 2, 3, 4]) == 0          # another backend (the GPU was lost)
    gpu.position = 0                                        # reset outside the engine (conformance)
    assert cache.reusable(gpu, [1, 2, 3, 4]) == 0
    gpu.position = 3
    cache.wrote(gpu, 5, [4])                                # a gap: the record cannot say what is there
    assert cache.backend is None and cache.ids == []
    cache.wrote(cpu, 0, [1])                                # position 0: the call wrote nothing
    assert cache.ids == [] and cache.backend is cpu
    cache.forget()
    assert cache.reusable(cpu, [1, 2]) == 0


def test_a_released_backend_has_no_record():
    class Released:
        @property
        def position(self):
            raise RuntimeError("released")
    cache, backend = PromptCache(), Released()
    cache.wrote(backend, 0, [1, 2])
    assert cache.backend is None and cache.reusable(backend, [1, 2, 3]) == 0
