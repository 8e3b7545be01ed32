"""Seeded random programs of offload-tier operations (specs/KV_OFFLOAD.md),
the way the OffloadingConnector's scheduler side issues them: requests whose
blocks share prefixes, lookups before loads, loads and stores completed later
(stores sometimes failing), requests finishing with transfers in flight,
resets. Deterministic by seed.

The program is generated against a model of what the scheduler knows (which
loads and stores it has in flight); answers it needs (which keys a lookup
found) come back through `send()`, so the generator is a coroutine.
"""

from __future__ import annotations

import random
from collections.abc import Generator
from dataclasses import dataclass, field

from harness.backends.offload_base import POLICIES, OffloadConfig, key_of


def draw_config(rng: random.Random, policies: tuple[str, ...] = POLICIES) -> OffloadConfig:
    num_chunks = rng.choice((1, 2, 3, 4, 6, 8, 12, 16))
    return OffloadConfig(
        num_chunks=num_chunks,
        cache_policy=rng.choice(policies),
        enable_events=rng.random() < 0.8,
        store_threshold=rng.choice((0, 1, 1, 2, 3)),
        max_tracker_size=rng.choice((3, 8, 64_000)))


@dataclass(slots=True)
class _Request:
    name: str
    keys: list[bytes]
    live: bool = True


@dataclass(slots=True)
class Model:
    """What the scheduler side has in flight (keys pinned by loads, keys
    being stored): the invariants read it too."""

    loads: list[tuple[str, list[bytes]]] = field(default_factory=list)
    # (request, keys the store writes, keys it was offered)
    stores: list[tuple[str, list[bytes], list[bytes]]] = field(default_factory=list)

    def pins(self) -> dict[bytes, int]:
        out: dict[bytes, int] = {}
        for _, keys in self.loads:
            for k in keys:
                out[k] = out.get(k, 0) + 1
        return out

    def storing(self) -> set[bytes]:
        return {k for _, keys, _ in self.stores for k in keys}


_WEIGHTS = {"new_request": 7, "lookup": 8, "load": 12, "complete_load": 10, "touch": 6,
            "store": 18, "complete_store": 15, "finished": 5, "schedule_end": 3,
            "take_events": 5, "stats": 4, "reset": 0.4, "misuse": 1}
_KINDS = list(_WEIGHTS)
_CUM = list(_WEIGHTS.values())


def program(rng: random.Random, config: OffloadConfig, length: int,
            model: Model) -> Generator[tuple, object, None]:
    """Yields operations; each yield receives the operation's agreed answer."""
    groups = rng.choice((1, 1, 2))
    span = 3 * config.num_chunks + 4
    prefixes = [[rng.randrange(span) for _ in range(rng.randrange(1, 6))] for _ in range(3)]
    requests: list[_Request] = []
    counter = 0
    done = 0
    while done < length:
        kind = rng.choices(_KINDS, _CUM)[0]
        live = [r for r in requests if r.live]
        if kind == "new_request" or not live:
            counter += 1
            hashes = list(rng.choice(prefixes)) + [rng.randrange(span)
                                                    for _ in range(rng.randrange(0, 6))]
            keys = [key_of(h, g) for g in range(groups) for h in hashes]
            req = _Request(f"r{counter}", list(dict.fromkeys(keys)))
            requests.append(req)
            done += 1
            yield ("new_request", req.name)
            if rng.random() < 0.3:
                # The scheduler knows where each block ends in the request.
                for i, k in enumerate(req.keys):
                    done += 1
                    yield ("position", req.name, k, 16 * (i % (len(req.keys) // groups or 1) + 1))
            continue
        req = rng.choice(live)
        if kind == "lookup":
            done += 1
            yield ("lookup", req.name, rng.choice(req.keys))
        elif kind == "load":
            start = rng.randrange(len(req.keys))
            hits = []
            for k in req.keys[start:start + rng.randrange(1, 5)]:
                done += 1
                if (yield ("lookup", req.name, k)) != "HIT":
                    break
                hits.append(k)
            if hits and rng.random() < 0.3:
                done += 1
                yield ("load_source", req.name, hits[0])
            if hits:
                # In the model before the call, so the invariants see the pin.
                model.loads.append((req.name, hits))
                done += 1
                yield ("prepare_load", req.name, hits)
        elif kind == "complete_load" and model.loads:
            name, keys = model.loads.pop(rng.randrange(len(model.loads)))
            done += 1
            yield ("complete_load", name, list(reversed(keys)) if rng.random() < 0.3 else keys)
        elif kind == "touch":
            done += 1
            many = rng.randrange(1, min(4, len(req.keys)) + 1)
            yield ("touch", req.name, rng.sample(req.keys, many))
        elif kind == "store":
            start = rng.randrange(len(req.keys))
            keys = req.keys[start:start + rng.randrange(1, 2 * config.num_chunks + 2)]
            if rng.random() < 0.2:
                keys = list(reversed(keys))  # a backfill offers later blocks first
            done += 1
            answer = yield ("prepare_store", req.name, keys)
            if isinstance(answer, dict) and answer.get("keys_to_store"):
                stored = [bytes.fromhex(h) for h in answer["keys_to_store"]]
                model.stores.append((req.name, stored, keys))
        elif kind == "complete_store" and model.stores:
            name, stored, offered = model.stores.pop(rng.randrange(len(model.stores)))
            keys = stored
            if rng.random() < 0.5:
                # The completion may list offered blocks the job did not write
                # (ready or gone: left alone), never another job's pending one.
                pending = model.storing()
                keys = [k for k in offered if k in stored or k not in pending]
            done += 1
            yield ("complete_store", name, keys, rng.random() < 0.85)
        elif kind == "finished":
            req.live = False
            done += 1
            yield ("finished", req.name)
        elif kind == "schedule_end":
            done += 1
            yield ("schedule_end", [r.name for r in live[-2:]], [])
        elif kind == "take_events":
            done += 1
            yield ("take_events",)
        elif kind == "stats":
            done += 1
            yield ("stats",)
        elif kind == "reset":
            # The scheduler never completes a transfer started before a reset.
            model.loads.clear()
            model.stores.clear()
            done += 1
            yield ("reset",)
        elif kind == "misuse":
            # A load of a key never stored, or a completion of nothing pinned:
            # both managers must refuse it before changing anything.
            k = key_of(span + 1, 0)
            done += 1
            yield (rng.choice(("prepare_load", "complete_load")), req.name, [k])
