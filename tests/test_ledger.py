"""The token-commit ledger (webslm.semantic.ledger): exactly-once, in-order commits under any
interleaving of async results, stale epochs, duplicates and cancels."""
from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings, strategies as st

from webslm.semantic.ledger import CommitRecord, Ledger, LedgerError, Replay

PROPS = settings(max_examples=500, derandomize=True, database=None, deadline=None,
                 print_blob=False)
H = "ab" * 32  # a well-formed sampler state hash


def state_hash(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


def test_a_generation_commits_in_order_and_replays():
    ledger = Ledger()
    epoch = ledger.begin([5, 6, 7])
    assert ledger.next_position == 3 and ledger.is_open
    first = ledger.offer(epoch, 3, 11, state_hash(1), "Hel")
    assert first == CommitRecord(epoch, 3, 11, state_hash(1), hashlib.sha256(b"Hel").hexdigest())
    assert ledger.offer(epoch, 4, 12, state_hash(2), "lo \u00e9") is not None
    assert ledger.committed_text == "Hello \u00e9" and ledger.committed_ids == (11, 12)
    assert ledger.replay() == Replay(epoch, (5, 6, 7), (11, 12), state_hash(2), 5)


def test_drops_are_counted_by_reason():
    ledger = Ledger()
    old = ledger.begin([])
    epoch = ledger.begin([1])
    assert ledger.offer(old, 1, 3, H, "a") is None            # stale
    assert ledger.offer(epoch, 2, 3, H, "a") is None          # out-of-order
    assert ledger.offer(epoch, 1, 3, H, "a") is not None
    assert ledger.offer(epoch, 1, 4, H, "b") is None          # duplicate
    assert ledger.dropped == {"stale": 1, "duplicate": 1, "out-of-order": 1}
    assert ledger.committed_text == "a"


def test_nothing_commits_after_cancel_but_the_committed_part_stays():
    ledger = Ledger()
    epoch = ledger.begin([0])
    ledger.offer(epoch, 1, 9, H, "x")
    after = ledger.cancel()
    assert after > epoch and not ledger.is_open
    assert ledger.offer(epoch, 2, 9, H, "y") is None
    assert ledger.offer(after, 2, 9, H, "y") is None  # the cancel epoch itself never commits
    assert ledger.committed_text == "x"
    assert ledger.replay() == Replay(epoch, (0,), (9,), H, 2)
    new = ledger.begin([1, 2])
    assert new > after and ledger.committed_text == "" and ledger.replay().sampler_state_hash is None


@pytest.mark.parametrize("args,code", [
    ((1, 0, 0, H, "a"), "unknown-epoch"), ((-1, 0, 0, H, "a"), "bad-argument"),
    ((0, 0, -2, H, "a"), "bad-argument"), ((0, 0, 0, "AB" * 32, "a"), "bad-argument"),
    ((0, 0, 0, H[:-1], "a"), "bad-argument"), ((0, 0, 0, H, b"a"), "bad-argument"),
    ((0, 0, 0, H, "\ud800"), "bad-argument"), ((0, True, 0, H, "a"), "bad-argument"),
])
def test_bad_offers_are_programming_errors(args, code):
    with pytest.raises(LedgerError) as err:
        Ledger().offer(*args)
    assert err.value.code == code


def test_bad_prompts_are_refused():
    with pytest.raises(LedgerError):
        Ledger().begin([1, -1])


# -- properties ----------------------------------------------------------------------------------

# An event: ("begin", prompt_len) | ("cancel",) | ("offer", epoch_back, position_shift, token).
# epoch_back picks an epoch already issued (0 = current); position_shift moves the offer
# around the next position (duplicates, gaps); most offers are on time.
EVENTS = st.one_of(
    st.tuples(st.just("begin"), st.integers(0, 4)),
    st.tuples(st.just("cancel")),
    st.tuples(st.just("offer"), st.sampled_from([0, 0, 0, 1, 2]),
              st.sampled_from([0, 0, 0, 0, -1, -2, 1, 2]), st.integers(0, 50)),
)


@PROPS
@given(st.lists(EVENTS, max_size=60))
def test_any_interleaving_keeps_the_ledger_exact(events):
    ledger = Ledger()
    issued = [0]
    model = None  # our own account: (epoch, prompt, accepted [(position, token, delta)], open)
    offers = commits = 0
    for event in events:
        if event[0] == "begin":
            epoch = ledger.begin(range(event[1]))
            assert epoch > issued[-1]
            issued.append(epoch)
            model = {"epoch": epoch, "prompt": event[1], "accepted": [], "open": True}
        elif event[0] == "cancel":
            issued.append(ledger.cancel())
            if model:
                model["open"] = False
        else:
            _, back, shift, token = event
            epoch = issued[max(0, len(issued) - 1 - back)]
            position = max(0, ledger.next_position + shift)
            delta = f"<{token}@{position}>"
            offers += 1
            record = ledger.offer(epoch, position, token, state_hash(token), delta)
            should = (model is not None and model["open"] and epoch == model["epoch"]
                      and position == model["prompt"] + len(model["accepted"]))
            assert (record is not None) == should
            if record:
                assert (record.generation_epoch, record.position, record.token_id) == (epoch, position, token)
                model["accepted"].append((position, token, delta))
                commits += 1
        if model is not None:
            accepted = model["accepted"]
            positions = [r.position for r in ledger.records]
            assert positions == list(range(model["prompt"], model["prompt"] + len(accepted)))
            assert all(r.generation_epoch == model["epoch"] for r in ledger.records)
            assert ledger.committed_text == "".join(d for _, _, d in accepted)
            assert [r.text_delta_hash for r in ledger.records] == [
                hashlib.sha256(d.encode()).hexdigest() for _, _, d in accepted]
            assert ledger.replay().committed_ids == tuple(t for _, t, _ in accepted)
    assert commits + sum(ledger.dropped.values()) == offers  # every offer is accounted for


@PROPS
@given(st.lists(st.integers(0, 9), min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_shuffled_duplicated_results_commit_exactly_once_in_order(tokens, random):
    """An engine that retries: every result may arrive several times, in any order; offering
    until the ledger stops accepting commits each position exactly once."""
    ledger = Ledger()
    epoch = ledger.begin([])
    results = [(p, t) for p, t in enumerate(tokens)] * 3
    offers = 0
    while ledger.next_position < len(tokens):
        random.shuffle(results)
        for position, token in results:
            offers += 1
            ledger.offer(epoch, position, token, state_hash(position), str(token))
    assert ledger.committed_ids == tuple(tokens)
    assert ledger.committed_text == "".join(map(str, tokens))
    assert ledger.dropped["stale"] == 0
    assert sum(ledger.dropped.values()) == offers - len(tokens)
