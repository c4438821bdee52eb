"""The plan's identity and its independent checker.

`canonical_json(obj)` and `plan_hash(plan_dict)` define the bytes a plan hash covers: JSON
with sorted keys, no spaces, ASCII only, no NaN (plans hold only ints, strings, lists, dicts,
None and booleans). `verify(plan)` re-derives everything a plan claims from the plan's own
data, never from the planner's code, so a bug in the planner (or a tampered plan) cannot vouch
for itself. It raises PlanInvalid(code, where, sentence) on the first defect:

    bad-structure           a field is missing or has the wrong type
    out-of-buffer           a region reaches past its buffer (or starts below 0)
    misaligned              a region's offset is not a multiple of its alignment, or its
                            alignment is below the device's minimum for its binding kind
    buffer-too-large        a buffer exceeds maxBufferSize
    binding-too-large       a storage binding exceeds maxStorageBufferBindingSize, or a
                            uniform binding exceeds maxUniformBufferBindingSize
    bad-size                a bound size that is not a multiple of 4
    bad-interval            a live interval outside its schedule, reversed, or straddling the
                            layer loop (partly inside it, partly outside)
    overlap-without-proof   two regions share bytes and no proof record names that sharing
    bad-proof               a proof whose claim is false (live ranges overlap, wrong
                            producer/last consumer, wrong bytes) or that names no real sharing
    bad-split               split pieces that do not tile their part exactly
    bad-total               a part's bytes, the total, the KV formula or the reserve disagree
    bad-hash                the hash is not the sha256 of the plan's canonical JSON

Why aliasing is safe when intervals are disjoint: a region is live from its first producer
step b to its last consumer step e (inclusive), steps run in order and every step waits for
the ones before it (one queue, WebGPU orders dispatches within a submit). If e_i < b_j then
every read of i happens before the first write of j, so j may reuse i's bytes. Equal ends
(e_i == b_j) are not disjoint: one dispatch would read i and write j through aliased bindings.
The layer body runs once per layer on the same regions; two intervals that both lie inside
the body and are disjoint there are disjoint across iterations too (each spans less than one
body length), which is why an interval may not straddle the body's bounds.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from ..errors import CodedError


class PlanInvalid(CodedError):
    """verify() found a plan that does not prove what it claims."""


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def plan_hash(plan_dict: dict) -> str:
    """sha256 of the canonical JSON of the plan without its own `hash` field."""
    body = {k: v for k, v in plan_dict.items() if k != "hash"}
    return hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()


def _fail(code: str, where: str, sentence: str):
    raise PlanInvalid(code, where, sentence)


def verify(plan) -> None:
    """Check a MemoryPlan (or its as_dict()) from its own data; raise PlanInvalid if wrong."""
    p = plan.as_dict() if hasattr(plan, "as_dict") else plan
    try:
        limits = p["limits"]
        buffers = {b["name"]: b for b in p["buffers"]}
        regions = {r["name"]: r for r in p["regions"]}
        schedules = p["schedules"]
        proofs = p["proofs"]
    except (KeyError, TypeError) as exc:
        _fail("bad-structure", "plan", f"the plan lacks a field every plan has ({exc})")
    if len(buffers) != len(p["buffers"]) or len(regions) != len(p["regions"]):
        _fail("bad-structure", "plan", "buffer and region names must be unique")
    storage_align = limits["minStorageBufferOffsetAlignment"]
    uniform_align = limits["minUniformBufferOffsetAlignment"]
    binding_limit = limits["maxStorageBufferBindingSize"]

    # 1. Buffers within maxBufferSize; regions inside their buffers, aligned, bindings in limits.
    for b in p["buffers"]:
        if b["size"] > limits["maxBufferSize"]:
            _fail("buffer-too-large", b["name"], f"{b['size']} bytes exceed maxBufferSize {limits['maxBufferSize']}")
    for r in p["regions"]:
        name = r["name"]
        buffer = buffers.get(r["buffer"])
        if buffer is None:
            _fail("bad-structure", name, f"names buffer {r['buffer']!r}, which the plan does not create")
        if r["offset"] < 0 or r["size"] < 1 or r["offset"] + r["size"] > buffer["size"]:
            _fail("out-of-buffer", name, f"[{r['offset']}, {r['offset'] + r['size']}) is not inside "
                                         f"{buffer['name']} ({buffer['size']} bytes)")
        minimum = {"uniform": uniform_align, "copy": 4}.get(r["binding"], storage_align)
        if r["alignment"] < minimum or r["alignment"] % minimum or r["offset"] % r["alignment"]:
            _fail("misaligned", name, f"offset {r['offset']} with alignment {r['alignment']}; the "
                                      f"{r['binding']} binding needs a multiple of {minimum}")
        if r["binding"] in ("storage", "read-only-storage"):
            if r["size"] > binding_limit:
                _fail("binding-too-large", name, f"a {r['size']}-byte binding exceeds "
                                                 f"maxStorageBufferBindingSize {binding_limit}")
            if r["size"] % 4:
                _fail("bad-size", name, f"storage binding size {r['size']} is not a multiple of 4")
        elif r["binding"] == "uniform":
            slot = r["slot_stride"]
            if r["binding_size"] > limits["maxUniformBufferBindingSize"] or r["binding_size"] > slot:
                _fail("binding-too-large", name, f"uniform slots of {r['binding_size']} bytes exceed "
                                                 f"maxUniformBufferBindingSize or the slot stride {slot}")
            if slot % uniform_align or r["slots"] * slot != r["size"]:
                _fail("misaligned", name, f"{r['slots']} slots of stride {slot} do not tile {r['size']} bytes "
                                          f"at alignment {uniform_align}")

    # 2. Live intervals: inside the schedule, ordered, not straddling the layer loop.
    for r in p["regions"]:
        if r["schedule"] is None:
            continue
        sched = schedules.get(r["schedule"])
        if sched is None:
            _fail("bad-interval", r["name"], f"unknown schedule {r['schedule']!r}")
        (b, e), n = r["interval"], len(sched["steps"])
        lo, hi = sched["layer_loop"]
        if not 0 <= b <= e < n:
            _fail("bad-interval", r["name"], f"interval [{b}, {e}] is not an ordered range of 0..{n - 1}")
        inside, around = lo <= b and e <= hi, b < lo and e > hi
        outside = e < lo or b > hi
        if not (inside or around or outside):
            _fail("bad-interval", r["name"], f"interval [{b}, {e}] straddles the layer loop [{lo}, {hi}]")

    # 3. Every byte shared by two regions needs a proof that holds; every proof needs a sharing.
    exclusive = {frozenset(pair) for pair in p["exclusive_schedules"]}
    shared = _sharing(p["regions"])
    claims = {}
    for proof in proofs:
        key = (proof["first"], proof["then"])
        if key in claims or key[::-1] in claims:
            _fail("bad-proof", f"{key[0]} / {key[1]}", "two proofs for one pair")
        claims[key] = proof
    for (x, y), (offset, size) in shared.items():
        proof = claims.pop((x, y), None) or claims.pop((y, x), None)
        if proof is None:
            _fail("overlap-without-proof", f"{x} / {y}",
                  f"bytes [{offset}, {offset + size}) of {regions[x]['buffer']} belong to both and no proof "
                  f"record says why")
        _check_proof(proof, regions, schedules, exclusive, offset, size)
    if claims:
        first = next(iter(claims))
        _fail("bad-proof", f"{first[0]} / {first[1]}", "a proof names two regions that share no bytes")

    # 4. Splits tile their parts exactly, piece by piece, in row order.
    for split in p["splits"]:
        for part, names in split["pieces"].items():
            rows, offset, total = 0, None, 0
            for name in names:
                piece = regions.get(name)
                if piece is None or piece["source"]["tensor"] != split["tensor"]:
                    _fail("bad-split", split["tensor"], f"piece {name!r} is not a region of this tensor")
                a, z = piece["source"]["rows"]
                if a != rows or z <= a:
                    _fail("bad-split", name, f"rows [{a}, {z}) do not continue at row {rows}")
                rows, total = z, total + piece["source"]["length"]
            if rows != split["rows"] or total != split["part_lengths"][part]:
                _fail("bad-split", split["tensor"], f"the pieces of {part} cover {rows} rows / {total} bytes, "
                                                    f"not {split['rows']} / {split['part_lengths'][part]}")

    # 5. Totals: parts are the sums of their buffers, the KV formula holds, the reserve is v1's.
    by_part = {}
    for b in p["buffers"]:
        by_part[b["part"]] = by_part.get(b["part"], 0) + b["size"]
    gpu = p["gpu_bytes"]
    for part, value in gpu.items():
        if part != "reserve" and value != by_part.get(part, 0):
            _fail("bad-total", part, f"claims {value} bytes, its buffers hold {by_part.get(part, 0)}")
    if set(by_part) - set(gpu):
        _fail("bad-total", "gpu_bytes", f"parts {sorted(set(by_part) - set(gpu))} are not counted")
    owned = sum(v for k, v in gpu.items() if k != "reserve")
    if gpu["reserve"] != max(64 << 20, -(-owned * 15 // 100)):
        _fail("bad-total", "reserve", f"reserve-v1 of {owned} owned bytes is max(64 MiB, 15%), not {gpu['reserve']}")
    if p["total_gpu_bytes"] != sum(gpu.values()) or p["total_cpu_bytes"] != sum(p["cpu_bytes"].values()):
        _fail("bad-total", "total", "a total is not the sum of its parts")
    kv = p["kv"]
    formula = kv["layers"] * kv["capacity"] * kv["n_kv_heads"] * kv["head_dim"] * 2 * kv["element_bytes"]
    kv_regions = sum(r["size"] for r in p["regions"] if r["part"] == "kv")
    if kv["formula_bytes"] != formula or kv_regions != formula:
        _fail("bad-total", "kv", f"KV regions hold {kv_regions} bytes; L x C x H_kv x D_h x 2 x B = {formula}")

    # 6. The hash covers all of the above.
    if p.get("hash") != plan_hash(p):
        _fail("bad-hash", "hash", "the hash is not the sha256 of the plan's canonical JSON")


def _sharing(regions: list[dict]) -> dict[tuple[str, str], tuple[int, int]]:
    """{(a, b): (offset, size)} for every pair of regions of one buffer whose bytes intersect,
    found by a sweep over regions sorted by offset (weight pools hold hundreds of regions)."""
    by_buffer: dict[str, list[dict]] = {}
    for r in regions:
        by_buffer.setdefault(r["buffer"], []).append(r)
    found = {}
    for members in by_buffer.values():
        members = sorted(members, key=lambda r: (r["offset"], r["name"]))
        active: list[dict] = []
        for r in members:
            active = [a for a in active if a["offset"] + a["size"] > r["offset"]]
            for a in active:
                start, end = r["offset"], min(a["offset"] + a["size"], r["offset"] + r["size"])
                if end > start:
                    found[(a["name"], r["name"])] = (start, end - start)
            active.append(r)
    return found


def _check_proof(proof: dict, regions: dict, schedules: dict, exclusive: set, offset: int, size: int) -> None:
    where = f"{proof['first']} / {proof['then']}"
    if (proof["offset"], proof["size"]) != (offset, size):
        _fail("bad-proof", where, f"claims bytes [{proof['offset']}, +{proof['size']}), they share "
                                  f"[{offset}, +{size})")
    first, then = regions[proof["first"]], regions[proof["then"]]
    if first["schedule"] is None or then["schedule"] is None:
        _fail("bad-proof", where, "a region live for the whole session cannot share bytes")
    if first["schedule"] != then["schedule"]:
        if frozenset((first["schedule"], then["schedule"])) not in exclusive:
            _fail("bad-proof", where, f"schedules {first['schedule']} and {then['schedule']} are not exclusive")
        if proof["reason"] != f"schedules exclusive: {first['schedule']} / {then['schedule']}":
            _fail("bad-proof", where, f"reason {proof['reason']!r} is not the schedules' exclusion")
        return
    steps = schedules[first["schedule"]]["steps"]
    e_i, b_j = first["interval"][1], then["interval"][0]
    if proof["last_consumer"] not in steps or steps.index(proof["last_consumer"]) != e_i:
        _fail("bad-proof", where, f"last consumer {proof['last_consumer']!r} is not step {e_i} of {proof['first']}")
    if proof["producer"] not in steps or steps.index(proof["producer"]) != b_j:
        _fail("bad-proof", where, f"producer {proof['producer']!r} is not step {b_j} of {proof['then']}")
    if not e_i < b_j:
        _fail("bad-proof", where, f"live ranges overlap: {proof['first']} is read until step {e_i}, "
                                  f"{proof['then']} written from step {b_j}")
    if proof["reason"] != f"intervals disjoint: {e_i} < {b_j}":
        _fail("bad-proof", where, f"reason {proof['reason']!r} does not state e_i < b_j")
