"""Turning fuzz actions into valid KV-manager calls, run in lockstep.

"Valid" means a call sequence vLLM's scheduler could produce (specs/FUZZING.md):
- a request is looked up only while waiting with nothing computed, and the
  lookup's hit is adopted by the allocation that immediately follows it;
- an allocation asks for at least one new token, never more than the request's
  unscheduled tokens, or (asynchronous KV load) only external tokens with
  delayed caching; external tokens leave the last prompt token to compute;
- tokens are sampled only for a running request whose scheduled tokens are all
  computed; a request waiting for a KV load is neither scheduled nor sampled
  until the load finishes, and then is not looked up again;
- only running requests are preempted; any request may finish (abort);
- record_prefix_cache_stats follows an admission, where the profile says so;
- reset and eviction of block ids (< num_blocks) may come at any time;
- encoder-decoder models (a cross-attention group) pass the request's encoder
  tokens at each admission;
- with a Mamba group in "align" mode a prefill chunk ends where the scheduler
  would end it (`_mamba_block_aligned_split`): at block boundaries, the last
  cacheable boundary and the prompt's partial-hit boundary, unless the chunk
  exports a prefill checkpoint into a reserved block; in configs that report
  it, also at the shared-prefix junction a lookup found (floored to a block);
- the copy-on-write copies allocations queue (hits inside blocks) and the
  Mamba boundary states offered to a connector are drained before each step
  boundary, as the scheduler drains them at the end of each schedule pass; a
  finishing request may first hand over its prompt tails (a KV producer).
- HiSparse: at each step boundary the connector's calls run for the requests
  scheduled since the last one (hisparse_step); the workers' reports
  (hisparse_ack) name only transfers and host copies an earlier step handed
  out, each transfer's worker count once; a finished asynchronous load is
  reported to the connector before its blocks are cached, a failed one frees
  the request back to waiting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from harness.backends.base import Backend
from harness.backends.lockstep import run_event
from harness.core.cache_config import CacheConfig
from harness.core.compare import Failure
from harness.core.events import (
    DEFAULT_CHECKPOINT_FIELDS,
    AddRequest,
    Allocate,
    AppendTokens,
    CacheBlocks,
    Checkpoint,
    EstimateCachedTokens,
    Event,
    EvictBlocks,
    FinalizePartialTailOffloads,
    Free,
    GetBlockIdsForComputedTokens,
    GetNumCommonPrefixBlocks,
    HiSparseAck,
    HiSparseStep,
    Lookup,
    LoRA,
    MMFeature,
    PromptEmbeds,
    RecordStats,
    ResetPrefixCache,
    Step,
    TakeBlockCopies,
    TakeBoundaryStateOffloads,
    TruncateComputedBlocks,
)
from harness.core.events import Preempt as PreemptEvent
from harness.fuzz.actions import (
    Ack,
    Action,
    Evict,
    Finish,
    FinishLoad,
    New,
    Observe,
    Preempt,
    Reset,
    Sample,
    Schedule,
    StepBoundary,
)
from impl.mamba_checkpoint import (
    get_mamba_prefill_checkpoint_position,
    is_mamba_prefill_checkpoint_valid,
)
from impl.profiles import StatsRecordedAt, VersionProfile

# Values per token of a fuzzed request's prompt embeddings (few: only their
# bytes reach the hashes).
EMBEDS_DIM = 4


class _Status(Enum):
    WAITING = 1
    RUNNING = 2
    LOADING = 3  # waiting for an asynchronous KV load


@dataclass(slots=True)
class _Req:
    num_tokens: int
    num_computed: int = 0
    status: _Status = _Status.WAITING
    num_prompt: int = 0
    encoder_tokens: int = 0


@dataclass(slots=True)
class FuzzRun:
    # The calls with the reference's answers (a rejected last call: None).
    events: list[tuple[Event, dict | None]] = field(default_factory=list)
    failure: Failure | None = None
    # A state signature per call, for counting distinct states reached.
    signatures: set = field(default_factory=set)
    # Why the case did not run: both backends refuse its config.
    refused: str | None = None
    # Why a foreign backend did not run it (to the end): outside its
    # capabilities (specs/FOREIGN_BACKEND.md), "not covered by exec:CMD: why".
    not_covered: str | None = None

    @property
    def failed(self) -> bool:
        return self.failure is not None


def _lora(n: int) -> LoRA:
    return LoRA(f"adapter-{n}", n, f"/loras/{n}")


def _takes(backend: Backend, op: str) -> bool:
    """Whether a backend takes the op: a foreign one declares its ops."""
    capabilities = getattr(backend, "capabilities", None)
    return capabilities is None or op in (capabilities.get("ops") or ())


class Driver:
    """Turns actions into calls, each run by harness/lockstep.run_event on
    backends[0] (the reference, vLLM) and every other backend; stops at the
    first failure."""

    def __init__(self, config: CacheConfig, profile: VersionProfile, backends: list[Backend]):
        self.config = config
        self.backends = backends
        self.reference, self.others = backends[0], tuple(backends[1:])
        self.reqs: dict[int, _Req] = {}
        self.used: set[int] = set()
        self.run = FuzzRun()
        self.record_at_admission = profile.stats_recorded_at is StatsRecordedAt.ADMISSION
        self.lookup_takes_bound = profile.max_cache_hit_length
        # A request a connector loads tokens for is looked up as the
        # scheduler does with a connector (0.27+); a hit may be cut back to
        # this alignment, None: never. A multiple of every manager's block
        # (context parallelism widens them) and of the scheduler's block.
        self.connector_lookup = profile.connector_lookup
        self.truncate_alignment = None
        if profile.connector_lookup and all(g.kind != "circular_buffer" for g in config.groups):
            cp = config.dcp_world_size * config.pcp_world_size
            self.truncate_alignment = math.lcm(config.block_sizes(profile)[0],
                                               *(g.block_size * cp for g in config.groups))
        # The admission arguments the profile's allocate_slots takes.
        self.admission_args = profile.admission_controls.args
        self.has_cross = any(g.kind == "cross_attention" for g in config.groups)
        # HiSparse: requests scheduled this step (req -> [first computed token,
        # tokens scheduled]), transfers in flight ([id, workers told or 0,
        # completions still due]) and host copies handed out.
        self.hisparse = config.hisparse
        self._scheduled: dict[str, list[int]] = {}
        self._transfers: list[list[int]] = []
        self._host_copies: list[int] = []
        # Copies are queued only by hits inside blocks.
        self.drain_copies = config.fine_grained_hits(profile)
        # Mamba "align": the scheduler's chunk splitting (see _mamba_split).
        self.mamba_block_size = next(
            (g.block_size for g in config.groups
             if g.kind == "mamba" and config.mamba_cache_mode(g) == "align"), None)
        # Boundary states offered to a connector (Mamba "align", 0.29+; 0.28's
        # pinned drain is no trace op).
        self.drain_offers = (self.mamba_block_size is not None
                             and profile.boundary_state_offloads.offers_keyed_states)
        # A finishing producer's own prompt-tail block (0.30+).
        self.finalize_tails = self.drain_offers and profile.boundary_state_offloads.finalizes
        # Where the prompt's tail lies (0.32 moved it before the last token).
        self.tail_rule = profile.prompt_tail_boundary
        # The scheduler's queries an observation asks too: those the release
        # has and every backend takes (a foreign one: its capabilities).
        self.queries = tuple(op for op, has in (
            (EstimateCachedTokens.kind, profile.estimate_cached_tokens is not None),
            (GetBlockIdsForComputedTokens.kind, profile.block_ids_for_computed_tokens),
            (GetNumCommonPrefixBlocks.kind, True),
        ) if has and all(_takes(b, op) for b in backends))
        if self.mamba_block_size is not None:
            self.scheduler_block_size, self.hash_block_size = config.block_sizes(profile)
            self.mamba_partial_hits = (
                self.hash_block_size < self.scheduler_block_size
                and config.fine_grained_hits(profile)
            )
            mambas = [g for g in config.groups if g.kind == "mamba"]
            # The scheduler exports checkpoints only when every Mamba group
            # has a block for them, at the first group's alignment.
            self.checkpoint_alignment = (
                mambas[0].prefill_checkpoint_alignment
                if all(g.num_prefill_checkpoint_blocks for g in mambas) else None)
            self.follow_junctions = config.reports_shared_prefix_boundary
            # Under EAGLE the scheduler's checkpoint positions move one unit
            # down (the unit an EAGLE hit drops), and a chunk stops exactly at
            # a junction (not floored to a block) when the manager keeps
            # junction states: the same narrowing as impl's KVCacheManager.
            self.eagle_drop = config.use_eagle
            drafts = config.use_eagle or any(g.is_eagle_group for g in config.groups)
            self.exact_junctions = (config.enable_mamba_shared_prefix_checkpoint and drafts
                                    and self.mamba_partial_hits
                                    and config.num_prefill_lookahead <= 1)

    def call(self, event: Event) -> dict | None:
        """Run one event everywhere; None once failed."""
        run = self.run
        answer = run_event(event, self.reference, self.others)
        if answer.__class__ is Failure:
            answer.index = len(run.events)
            run.failure = answer
            # The trace of a finding holds the call; vLLM's answer, if any.
            theirs = answer.answers.get(self.reference.name)
            run.events.append((event, theirs if isinstance(theirs, dict) else None))
            return None
        run.events.append((event, answer))
        return answer

    def execute(self, actions: list[Action]) -> FuzzRun:
        for action in actions:
            self.apply(action)
            if self.run.failed:
                break
            reqs = self.reqs
            self.run.signatures.add((
                type(action).__name__,
                sum(r.status is _Status.RUNNING for r in reqs.values()),
                len(reqs),
                self.backends[0].num_free_blocks(),
            ))
        return self.run

    # -- one action ------------------------------------------------------------------

    def apply(self, a: Action) -> None:
        call = self.call
        if isinstance(a, New):
            if a.req in self.used or len(a.prompt) > self.config.max_model_len:
                return
            self.used.add(a.req)
            self.reqs[a.req] = _Req(len(a.prompt), num_prompt=len(a.prompt),
                                    encoder_tokens=a.encoder_tokens)
            call(AddRequest(f"r{a.req}", list(a.prompt), cache_salt=a.cache_salt,
                            lora=_lora(a.lora) if a.lora else None,
                            mm=tuple(MMFeature(*m) for m in a.mm),
                            prompt_embeds=(None if a.embeds_seed is None
                                           else PromptEmbeds(EMBEDS_DIM, a.embeds_seed)),
                            kv_cache_report_mode="full" if a.full_report else "incremental"))
        elif isinstance(a, Schedule):
            self._schedule(a)
        elif isinstance(a, Sample):
            r = self.reqs.get(a.req)
            if r is None or r.status is not _Status.RUNNING or r.num_computed < r.num_tokens:
                return
            if call(AppendTokens(f"r{a.req}", list(a.tokens))) is not None:
                r.num_tokens += len(a.tokens)
        elif isinstance(a, FinishLoad):
            r = self.reqs.get(a.req)
            if r is None or r.status is not _Status.LOADING:
                return
            req = f"r{a.req}"
            if self.hisparse and call(HiSparseAck(
                    finished_imports=(req,), failed_imports=(req,) if a.failed else ())) is None:
                return
            if a.failed and self.hisparse:
                # Nothing loaded is valid: freed, to be scheduled again.
                if call(PreemptEvent(req)) is not None:
                    r.status, r.num_computed = _Status.WAITING, 0
                return
            call(CacheBlocks(req, r.num_computed))
            r.status = _Status.WAITING
        elif isinstance(a, Finish):
            if self.reqs.pop(a.req, None) is not None:
                self._scheduled.pop(f"r{a.req}", None)
                if a.finalize and self.finalize_tails and call(
                        FinalizePartialTailOffloads(f"r{a.req}")) is None:
                    return
                call(Free(f"r{a.req}"))
        elif isinstance(a, Preempt):
            r = self.reqs.get(a.req)
            if r is None or r.status is not _Status.RUNNING:
                return
            self._scheduled.pop(f"r{a.req}", None)
            if call(PreemptEvent(f"r{a.req}")) is not None:
                r.status, r.num_computed = _Status.WAITING, 0
        elif isinstance(a, Reset):
            call(ResetPrefixCache())
        elif isinstance(a, Evict):
            ids = [b for b in a.block_ids if b < self.config.num_blocks]
            if ids:
                call(EvictBlocks(ids))
        elif isinstance(a, StepBoundary):
            if self.hisparse and not self._hisparse_step():
                return
            if self.drain_copies and call(TakeBlockCopies()) is None:
                return
            if self.drain_offers and call(TakeBoundaryStateOffloads()) is None:
                return
            call(Step())
        elif isinstance(a, Observe):
            call(Checkpoint(DEFAULT_CHECKPOINT_FIELDS + ("hisparse",)) if self.hisparse
                 else Checkpoint())
            self._ask_queries()
        elif isinstance(a, Ack):
            if self.hisparse:
                self._hisparse_ack(a)

    # -- HiSparse's connector ---------------------------------------------------------

    def _note_scheduled(self, req: str, start: int, count: int) -> None:
        if not self.hisparse or count < 1:
            return
        if req in self._scheduled:
            self._scheduled[req][1] += count  # scheduled again before the step ended
        else:
            self._scheduled[req] = [start, count]

    def _hisparse_step(self) -> bool:
        if not self._scheduled:
            return True
        scheduled = tuple((req, start, count) for req, (start, count) in self._scheduled.items())
        self._scheduled.clear()
        answer = self.call(HiSparseStep(scheduled))
        if answer is None:
            return False
        for t in answer["transfers"] or ():
            self._transfers.append([t["transfer_id"], 0, 0])
        self._host_copies += [copy for _source, copy in answer["host_copies"]]
        return True

    def _hisparse_ack(self, a: Ack) -> None:
        enqueued, completed = [], []
        for transfer in self._transfers[:max(a.count, 0)]:
            transfer_id, told, due = transfer
            if not told:
                transfer[1] = transfer[2] = due = max(a.workers, 1)
                enqueued.append((transfer_id, due))
            done = 1 if a.split and due > 1 else due
            transfer[2] -= done
            completed.append((transfer_id, done))
        self._transfers = [t for t in self._transfers if t[2] > 0 or not t[1]]
        copies, self._host_copies = tuple(self._host_copies), []
        if enqueued or completed or copies:
            self.call(HiSparseAck(copies_done=copies, enqueued=tuple(enqueued),
                                  completed=tuple(completed)))

    def _mamba_split(self, r: _Req, start: int, num_new: int, junction: int = 0) -> int:
        """Clip a prefill chunk the way vLLM's scheduler does for Mamba "align"
        (EAGLE's drop moving each position one unit down): Mamba states are written at
        chunk ends, so chunks end on block boundaries, at the last cacheable
        boundary and, with hits inside blocks, at the prompt's last hash
        boundary; a chunk whose checkpoint a backend exports into a reserved
        block needs neither of the latter two. `junction`: a shared-prefix
        boundary the chunk stops at (floored to whole blocks from its start,
        or exactly where the manager keeps junction states)."""
        if self.mamba_block_size is None:
            return num_new
        prefill_end = max(r.num_prompt, r.num_tokens - 1)
        if start >= prefill_end:
            return num_new
        bs = self.mamba_block_size
        hbs = self.hash_block_size
        end = start + num_new
        drop, rule = self.eagle_drop, self.tail_rule
        exported = end >= prefill_end and is_mamba_prefill_checkpoint_valid(
            start, end,
            get_mamba_prefill_checkpoint_position(
                prefill_end, hbs if self.mamba_partial_hits else self.scheduler_block_size,
                drop, rule=rule),
            hbs, bs, self.checkpoint_alignment)
        last_cache_position = 0 if exported else get_mamba_prefill_checkpoint_position(
            r.num_tokens, bs, drop, rule=rule)
        if end < prefill_end:
            end = end // bs * bs
        tail = 0
        if self.mamba_partial_hits and not exported:
            tail = get_mamba_prefill_checkpoint_position(r.num_prompt, hbs, drop, rule=rule)
        if self.exact_junctions and junction <= r.num_prompt:
            junction_stop = junction
        else:
            junction_stop = start + (junction - start) // bs * bs
        stops = (
            (start // bs + 1) * bs if start % bs and not exported else 0,
            last_cache_position,
            tail if last_cache_position < tail < r.num_prompt else 0,
            junction_stop if start < junction < end else 0,
        )
        end = min((s for s in stops if start < s < end), default=end)
        return max(end - start, 0)

    def _junction(self, req: str) -> int:
        """The shared-prefix boundary the reference's last lookup gave `req`."""
        if self.mamba_block_size is None or not self.follow_junctions:
            return 0
        request = self.reference.requests.get(req)
        return getattr(request, "shared_prefix_boundary", 0) or 0

    def _connector_hit(self, req: str, r, a: Schedule, hit: int, answer: dict):
        """What the scheduler does with a connector's lookup: a hit ahead of
        a lagging group needs the connector to load (else the plain lookup
        reconciles it); half the requests (by number, no draw: the case's
        calls stay as drawn) have their hit cut back to half, aligned (to
        nothing for a hit of one unit), the connector loading the rest."""
        if answer.get("hit_diverged") and min(a.external, r.num_tokens - hit - 1) <= 0:
            answer = self.call(Lookup(req))
            return (0, None) if answer is None else (answer["hit_tokens"], answer)
        align = self.truncate_alignment
        if align and hit >= align and a.req % 2 == 0:
            cut = hit // align // 2 * align
            if self.call(TruncateComputedBlocks(req, cut)) is None:
                return 0, None
            hit = cut
        return hit, answer

    def _ask_queries(self) -> None:
        """For the latest running request (its tables are live): the
        cached-token estimate, its computed tokens' ids and the prefix it
        shares with every other request."""
        running = [i for i, r in self.reqs.items() if r.status is _Status.RUNNING]
        if not running:
            return
        i, asks = running[-1], []
        if EstimateCachedTokens.kind in self.queries:
            asks.append(EstimateCachedTokens(f"r{i}"))
        if GetBlockIdsForComputedTokens.kind in self.queries:
            asks.append(GetBlockIdsForComputedTokens(f"r{i}", self.reqs[i].num_computed))
        if GetNumCommonPrefixBlocks.kind in self.queries:
            asks.append(GetNumCommonPrefixBlocks(f"r{i}"))
        for ask in asks:
            if self.call(ask) is None:
                return

    def _schedule(self, a: Schedule) -> None:
        r = self.reqs.get(a.req)
        if r is None or r.status is _Status.LOADING or a.num_new_tokens < 1:
            return
        req = f"r{a.req}"
        if r.status is _Status.RUNNING:
            num_new = min(a.num_new_tokens, r.num_tokens - r.num_computed)
            num_new = self._mamba_split(r, r.num_computed, num_new, self._junction(req))
            if num_new < 1:
                return
            answer = self.call(Allocate(req, num_new, num_lookahead_tokens=a.lookahead))
            if answer is not None and "refused" not in answer:
                self._note_scheduled(req, r.num_computed, num_new)
                r.num_computed += num_new
            return
        drawn = dict(full_sequence_must_fit=a.full_sequence_must_fit,
                     reserved_blocks=a.reserved_blocks)
        admission = {k: v for k, v in drawn.items() if k in self.admission_args}
        if self.has_cross:
            admission["num_encoder_tokens"] = r.encoder_tokens
        if r.num_computed > 0:
            # Loaded by a connector: no lookup; schedule the rest.
            num_new = min(a.num_new_tokens, r.num_tokens - r.num_computed)
            num_new = self._mamba_split(r, r.num_computed, num_new, self._junction(req))
            if num_new < 1:
                return
            answer = self.call(Allocate(req, num_new, num_lookahead_tokens=a.lookahead,
                                        **admission))
            if answer is not None and "refused" not in answer:
                self._note_scheduled(req, r.num_computed, num_new)
                r.num_computed += num_new
                r.status = _Status.RUNNING
            return
        bound = None
        if a.max_hit is not None and self.lookup_takes_bound:
            bound = int(a.max_hit * (r.num_tokens - 1))
        with_connector = a.external > 0 and self.connector_lookup and bound is None
        answer = self.call(Lookup(req, bound, for_connector=with_connector))
        if answer is None:
            return
        hit = answer["hit_tokens"]
        if with_connector:
            hit, answer = self._connector_hit(req, r, a, hit, answer)
            if answer is None:
                return
        remaining = r.num_tokens - hit
        external = min(a.external, remaining - 1)
        if a.delay_cache and external > 0:
            num_new, delay = 0, True
        else:
            num_new, delay = min(a.num_new_tokens, remaining - external), False
            num_new = self._mamba_split(r, hit + max(external, 0), num_new,
                                        self._junction(req))
            if num_new < 1:
                return  # not scheduled this step; the hit is looked up again
        answer = self.call(Allocate(req, num_new, num_lookahead_tokens=a.lookahead,
                                    num_external_computed_tokens=max(external, 0),
                                    delay_cache_blocks=delay, **admission))
        if answer is None or "refused" in answer:
            return
        self._note_scheduled(req, hit + max(external, 0), num_new)
        r.num_computed = hit + max(external, 0) + num_new
        r.status = _Status.LOADING if delay else _Status.RUNNING
        if self.record_at_admission:
            self.call(RecordStats(req, hit))
