"""Anonymising a trace: a keyed, prefix-preserving bijection on token ids.

Every token is replaced by a keyed pseudo-random permutation of the vocabulary
whose key depends on the secret and on all tokens before it in the request's
sequence (prompt, then appended output):

    state_0   = HMAC-SHA256(key, "kvconform-anon/1")
    out_i     = PRP(state_i, tok_i)           (a Feistel permutation of [0, V))
    state_i+1 = SHA-256(state_i || tok_i)

Two sequences map to sequences with the same common prefix, no longer and no
shorter, so prefix sharing, block boundaries, prefix hits, block ids and the
free-queue order replay exactly as in the original. Each position's
permutation is a bijection on [0, V), so the original tokens follow from the
anonymised ones with the key, and not without it; unlike a fixed substitution
the same token maps differently in different contexts, which defeats counting
token frequencies. V is one past the trace's largest token id (a first pass).

Also replaced, by keyed HMAC tags (equal inputs stay equal): request ids,
cache salts, LoRA names and paths, multimodal identifiers, session ids, and
the free-text description and notes (dropped).

Answers that depend on token values cannot be kept: block hashes of
`add_request` / `append_tokens` and the KV events of checkpoints (hashes and
token ids). They are dropped; the other fields of a checkpoint answer (free
queue, free blocks, usage, stats) become its `expect`, so a replay still
checks them, and every lookup, allocation and reset keeps its recorded answer.
`--rehash` then records the dropped answers anew from the installed vLLM
(same version as the trace's only).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass, field

from harness.capture.sinks import JsonlSink
from harness.core.progress import Progress
from harness.trace import open_trace
from harness.trace.codec import TraceHeader, event_to_dict

ENV_KEY = "KVCONFORM_ANON_KEY"
_ROUNDS = 6
_TOKEN_ANSWERS = ("add_request", "append_tokens")


class AnonymizeError(ValueError):
    """Bad input: one line, exit code 2."""


@dataclass(slots=True)
class _Feistel:
    """A keyed permutation of [0, n): balanced Feistel on 2h bits, cycle-walked."""

    n: int
    half: int = field(init=False)
    mask: int = field(init=False)

    def __post_init__(self) -> None:
        bits = max(2, (self.n - 1).bit_length())
        self.half = (bits + 1) // 2
        self.mask = (1 << self.half) - 1

    def permute(self, round_keys: bytes, x: int) -> int:
        while True:
            left, right = x >> self.half, x & self.mask
            for r in range(_ROUNDS):
                k = int.from_bytes(round_keys[4 * r: 4 * r + 4], "little")
                f = ((right * 0x9E3779B1) ^ k) & 0xFFFFFFFF
                f = ((f ^ (f >> 15)) * 0x85EBCA77) & 0xFFFFFFFF
                left, right = right, left ^ ((f ^ (f >> 13)) & self.mask)
            x = (left << self.half) | right
            if x < self.n:  # cycle walking keeps the permutation inside [0, n)
                return x


@dataclass(slots=True)
class Anonymizer:
    key: bytes
    vocab: int
    _prp: _Feistel = field(init=False)
    _root: bytes = field(init=False)
    # Request id -> (the chain state after its tokens so far).
    _state: dict[str, bytes] = field(default_factory=dict)
    _ids: dict[str, str] = field(default_factory=dict)
    _next_id: int = 0

    def __post_init__(self) -> None:
        self._prp = _Feistel(self.vocab)
        self._root = hmac.new(self.key, b"kvconform-anon/1", hashlib.sha256).digest()

    def tag(self, kind: str, value: str) -> str:
        """A keyed stand-in for a name: equal names stay equal."""
        digest = hmac.new(self.key, f"{kind}\0{value}".encode(), hashlib.sha256).hexdigest()
        return f"{kind}-{digest[:16]}"

    def request_id(self, req: str) -> str:
        rid = self._ids.get(req)
        if rid is None:
            rid = self._ids[req] = f"r{self._next_id}"
            self._next_id += 1
        return rid

    def tokens(self, req: str, tokens: list[int], start: bool) -> list[int]:
        state = self._root if start else self._state[req]
        out = []
        permute, sha = self._prp.permute, hashlib.sha256
        for t in tokens:
            round_keys = sha(state + b"prp").digest()
            out.append(permute(round_keys, t))
            state = sha(state + t.to_bytes(8, "little")).digest()
        self._state[req] = state
        return out

    def forget(self, req: str) -> None:
        self._state.pop(req, None)


def _max_token(path: str) -> int:
    top = 0
    for rec in open_trace(path).records:
        ev = rec.event
        toks = getattr(ev, "prompt", None) or getattr(ev, "tokens", None) or ()
        if toks:
            top = max(top, max(toks))
    return top


def resolve_key(key: str | None) -> bytes:
    key = key if key is not None else os.environ.get(ENV_KEY)
    if not key:
        raise AnonymizeError(f"anonymize needs a key: set the {ENV_KEY} environment "
                             "variable (keep it secret: it undoes the remap)")
    return key.encode()


def anonymize(src: str, out: str, key: bytes, vocab: int | None = None) -> int:
    """Write the anonymised copy of trace `src` to `out` (.jsonl); return its events."""
    vocab = vocab or _max_token(src) + 1
    anon = Anonymizer(key, max(vocab, 2))
    trace = open_trace(src)
    h = trace.header
    header = TraceHeader(h.vllm_version, h.source, h.cache,
                         "anonymised trace (kvconform anonymize)", h.model, None,
                         truncated=h.truncated)
    sink = JsonlSink(out, header)
    bar = Progress(trace.size, f"anonymize {src}", unit="bytes", delay=1.0)
    try:
        for rec in trace.records:
            sink.write(_rewrite(anon, event_to_dict(rec.event, rec.answer, rec.expect)))
            if sink.num_events % 4096 == 0:
                bar.update(trace.bytes_read() - bar.n)
    except BaseException:
        sink.abort()
        raise
    finally:
        bar.close()
    sink.close()
    return sink.num_events


def _rewrite(anon: Anonymizer, obj: dict) -> dict:
    op = obj["op"]
    if "req" in obj:
        original = obj["req"]
        obj["req"] = anon.request_id(original)
        if op == "add_request":
            obj["prompt"] = anon.tokens(original, obj["prompt"], start=True)
            if "cache_salt" in obj:
                obj["cache_salt"] = anon.tag("salt", obj["cache_salt"])
            if "lora" in obj:
                lo = obj["lora"]
                lo["name"] = anon.tag("lora", lo["name"])
                if "path" in lo:
                    lo["path"] = "/" + anon.tag("lora-path", lo["path"])
            for m in obj.get("mm", ()):
                m["identifier"] = anon.tag("mm", m["identifier"])
            if "session_id" in obj:
                obj["session_id"] = anon.tag("session", obj["session_id"])
        elif op == "append_tokens":
            obj["tokens"] = anon.tokens(original, obj["tokens"], start=False)
        elif op == "free":
            anon.forget(original)
            anon._ids.pop(original, None)
    if op in _TOKEN_ANSWERS:
        obj.pop("answer", None)
        obj.pop("expect", None)
    elif op == "checkpoint":
        fields = obj.get("fields")
        answer = obj.pop("answer", None)
        expect = obj.pop("expect", None)
        if fields is None or "events" in fields:
            # KV events carry hashes and token ids; the rest is still checked.
            kept = {k: v for k, v in (answer or expect or {}).items() if k != "events"}
            if kept:
                obj["expect"] = kept
        elif answer is not None:
            obj["answer"] = answer
        elif expect is not None:
            obj["expect"] = expect
    obj.pop("note", None)
    return obj
