"""The consumer check: a trace's KV events published as its release's
publisher does, and a consumer's beliefs about what is cached compared with
the engine's pool (impl, the trace's profile) after every published batch.

The consumer (any program, specs/FOREIGN_BACKEND.md) reads the events over
ZMQ and answers, over JSON lines on its stdin/stdout, how many leading full
blocks of each token sequence it believes cached, per KV cache group, and
where (medium). The sequences are those of the trace's requests (LoRA ones
with their adapter's name; salted or multimodal ones are left out: a
consumer cannot tell their extra keys from the tokens). The first answer
that differs from the pool is the result: exit 1, naming the trace line,
the event and the query.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.backends.base import BackendStopped
from harness.backends.exec_backend import start_channel, timeout_seconds
from harness.backends.impl_backend import ImplBackend
from harness.consumer.publisher import Publisher
from harness.core.events import AddRequest
from harness.core.exit_codes import ExitCode
from harness.trace import TraceError, open_trace

HELLO_KEY = "kvconform_consumer"
PROTOCOL = 1
TOPIC = "kv-events"
MEDIUM = "GPU"
# The most recent requests asked about after each batch (bounds a long trace's cost).
QUERIES_PER_STEP = 8


@dataclass(slots=True)
class ConsumerResult:
    exit_code: ExitCode
    message: str
    batches: int = 0
    queries: int = 0


def check_consumer(command: str, path: str) -> ConsumerResult:
    label = f"consumer {command}"
    try:
        trace = open_trace(path)
        cache = trace.header.cache
        sizes = {g.block_size for g in cache.groups}
        if len(sizes) != 1:
            raise TraceError(path, 1, "cache.groups", "consumer-check needs one block size "
                             "for every group")
        if not cache.enable_kv_cache_events or not cache.enable_caching:
            raise TraceError(path, 1, "cache", "consumer-check needs prefix caching and KV "
                             "cache events on")
        engine = ImplBackend(cache, trace.profile)
        publisher = Publisher(TOPIC, trace.profile.kv_events_map_layout)
    except TraceError as e:
        return ConsumerResult(e.exit_code, str(e))
    try:
        channel, _ = start_channel(command, HELLO_KEY, PROTOCOL, label, timeout_seconds())
    except BackendStopped as e:
        publisher.close()
        return ConsumerResult(e.exit_code, str(e))
    run = _Run(path, trace, engine, publisher, channel)
    try:
        return run.check()
    except BackendStopped as e:
        return ConsumerResult(e.exit_code, str(e), run.batches, run.queries)
    except TraceError as e:
        return ConsumerResult(e.exit_code, str(e), run.batches, run.queries)
    finally:
        channel.close()
        publisher.close()


class _Run:
    def __init__(self, path, trace, engine, publisher, channel) -> None:
        self.path, self.trace, self.engine = path, trace, engine
        self.publisher, self.channel = publisher, channel
        self.block_size = trace.header.cache.groups[0].block_size
        self.requests: dict[str, object] = {}  # kept after free: freed blocks stay cached
        self.batches = self.queries = 0

    def check(self) -> ConsumerResult:
        cache = self.trace.header.cache
        self.channel.send({"type": "subscribe", "endpoint": self.publisher.endpoint,
                           "replay_endpoint": self.publisher.replay_endpoint, "topic": TOPIC,
                           "block_size": self.block_size, "hash_algo": cache.hash_algo},
                          "at subscribe")
        self.channel.receive("at subscribe")
        for n, record in enumerate(self.trace.records):
            event = record.event
            try:
                self.engine.run(event)
            except Exception as e:  # noqa: BLE001 - the trace's own problem
                raise TraceError(self.path, record.line, event.kind,
                                 f"impl rejects this: {type(e).__name__}: {e}") from None
            if isinstance(event, AddRequest) and not (event.cache_salt or event.mm
                                                      or event.prompt_embeds):
                self.requests[event.req] = self.engine.requests[event.req]
            events = self.engine.manager.take_events()
            if not events:
                continue
            seq = self.publisher.publish(events)
            self.batches += 1
            problem = self._ask(seq, f"{self.path}:{record.line}: event #{n} ({event.kind})")
            if problem is not None:
                return ConsumerResult(ExitCode.DIVERGED, problem, self.batches, self.queries)
        return ConsumerResult(ExitCode.OK, f"{self.path}: the consumer agreed with the engine "
                              f"after each of {self.batches} batches ({self.queries} queries)",
                              self.batches, self.queries)

    def _truth(self, request, group: int) -> int:
        find = self.engine.manager.block_pool.get_cached_block
        n = 0
        for h in request.block_hashes:
            if find(h, [group]) is None:
                break
            n += 1
        return n

    def _ask(self, seq: int, where: str) -> str | None:
        recent = list(self.requests.items())[-QUERIES_PER_STEP:]
        queries, truths = [], {}
        for req, request in recent:
            tokens = list(request.all_token_ids)
            full = len(tokens) // self.block_size * self.block_size
            for g in range(len(self.trace.header.cache.groups)):
                qid = f"{req}/g{g}"
                queries.append({"id": qid, "token_ids": tokens[:full],
                                "lora_name": request.lora.name if request.lora else None,
                                "group_idx": g})
                truths[qid] = self._truth(request, g)
        if not queries:
            return None
        self.channel.send({"type": "query", "step": self.batches - 1, "last_seq": seq,
                           "queries": queries}, where)
        reply = self.channel.receive(where)
        answers = {a.get("id"): a for a in reply.get("answers") or () if isinstance(a, dict)}
        for q in queries:
            self.queries += 1
            want = truths[q["id"]]
            got = answers.get(q["id"], {})
            mine = (want, MEDIUM if want else None)
            theirs = (got.get("cached_blocks"), got.get("medium"))
            if theirs != mine:
                return (f"{where}: batch {seq}: query {q['id']} (request {q['id'].split('/')[0]}"
                        f", group {q['group_idx']}): the consumer believes {theirs[0]} blocks "
                        f"cached (medium {theirs[1]}), the engine holds {want} "
                        f"({mine[1]})")
        return None

