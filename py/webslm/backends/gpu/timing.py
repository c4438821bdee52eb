"""Timing on a GPU whose clocks move, for admission's tuning stage (tuning.py, tuning_attention.py).

Three problems, all measured on the H200 (docs/RESULTS.md):
- An idle GPU runs at low clocks (an SM clock of 345 MHz before the first burst), and the
  tuning stage leaves it idle while it compiles: a decode step timed during the stage took
  2.5 times as long as right after it. `settle` runs work until two rounds in a row agree.
- Clocks still drift while a burst runs, which favours whatever is timed last (one form's
  rule measured 9.6 us in one admission and 20.8 in the next). `alternating` times the
  contenders in turn, each pair of rounds once forward and once reversed, so a drift that is
  linear over a pair adds the same to every contender's pair mean.
- A pipeline's first use, right after the stage's compiles, can be slower than every later
  one: the rule's first look once read over SLOW_DISPATCH_SECONDS a dispatch, which marks a
  software adapter, and the 8B was left untuned. `looks_slow` looks again before it judges.
- A timed round ends with a read back to the host, whose round trip (0.2-0.6 ms there) a round
  of few dispatches is mostly made of: the SmolLM2 head's one dispatch a round measured 254 us,
  32 in the step. `round_trip` measures an empty submit and the same read, for the caller to
  subtract.
"""
from __future__ import annotations

import statistics
from typing import Awaitable, Callable, Sequence

SETTLE_SECONDS = 0.3           # at most this long waking the GPU's clocks before a timing burst
SETTLE_AGREE = 0.03            # ... until two rounds in a row agree this closely
PAIRS = 3                      # pairs of rounds (forward, reversed) per contender in `alternating`
TRIP_SAMPLES = 5               # empty rounds whose median is `round_trip`
SLOW_DISPATCH_SECONDS = 5e-4   # a rule dispatch slower than this: a software adapter, no tuning
SLOW_LOOKS = 2                 # looks again at a rule whose first (cold) look was slow (looks_slow)

Round = Callable[[], Awaitable[float]]      # one timed round: seconds (per op, per step, ...)


async def settle(one_round: Round, clock: Callable[[], float]) -> tuple[float, float | None, float | None]:
    """Run `one_round` until two rounds in a row agree within SETTLE_AGREE, or SETTLE_SECONDS
    pass; (seconds spent, the first round's figure, the last one's)."""
    began, rounds = clock(), []
    while clock() - began < SETTLE_SECONDS:
        rounds.append(await one_round())
        if len(rounds) >= 2 and abs(rounds[-1] - rounds[-2]) <= SETTLE_AGREE * rounds[-2]:
            break
    return round(clock() - began, 4), (rounds[0] if rounds else None), (rounds[-1] if rounds else None)


async def alternating(contenders: Sequence[Round], pairs: int = PAIRS) -> list[float]:
    """Each contender's figure: PAIRS pairs of rounds, the first in order (1, 2, 3), the second
    reversed (3, 2, 1); a pair's mean per contender; the median of the pair means (an odd slow
    sample moves one pair only)."""
    means: list[list[float]] = [[] for _ in contenders]
    for _ in range(pairs):
        pair = [0.0] * len(contenders)
        for order in (range(len(contenders)), reversed(range(len(contenders)))):
            for i in order:
                pair[i] += await contenders[i]() / 2
        for i, value in enumerate(pair):
            means[i].append(value)
    return [statistics.median(m) for m in means]


async def round_trip(device, sync: tuple, clock: Callable[[], float]) -> float:
    """Seconds from an empty submit to the end of reading `sync` (buffer, offset, size) back:
    what every timed round that ends with that read pays besides its dispatches (the median of
    TRIP_SAMPLES)."""
    samples = []
    for _ in range(TRIP_SAMPLES):
        await device.read_buffer(*sync)            # the queue is idle before the clock starts
        device.submit([])
        started = clock()
        await device.read_buffer(*sync)
        samples.append(clock() - started)
    return statistics.median(samples)


async def looks_slow(look: Callable[[], Awaitable[float]]) -> bool:
    """Whether the rule's first look (`look`: seconds a dispatch of 4 of the first form, one
    submission) says a slow adapter. The first look is the pipeline's first use, on a GPU whose
    clocks fell while admission compiled: on the H200 it once read over SLOW_DISPATCH_SECONDS,
    and the 8B was left untuned at 133.6 tok/s instead of 269 (bench/results/
    engine_h200_budget_8b_b4_2.json). So a slow first look is looked at again, up to
    SLOW_LOOKS times, and only the fastest look decides."""
    fastest = await look()
    for _ in range(SLOW_LOOKS):
        if fastest <= SLOW_DISPATCH_SECONDS:
            return False
        fastest = min(fastest, await look())
    return fastest > SLOW_DISPATCH_SECONDS
