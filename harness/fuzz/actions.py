"""Fuzz actions: what a scheduler may decide to do next, at the level a shrinker
can cut. The driver turns each into zero or more valid KV-manager calls; an
action that makes no sense in the current state (schedule a freed request,
sample a token for a request mid-prefill) is skipped. Any sub-list of a valid
program is therefore valid too, which is what makes shrinking simple.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class New:
    """A request arrives."""

    req: int
    prompt: tuple[int, ...]
    cache_salt: str | None = None
    lora: int | None = None  # adapter number, 1-based
    # Encoder tokens (encoder-decoder models): cross-attention blocks for them
    # are allocated at each admission.
    encoder_tokens: int = 0
    # kv_cache_report_mode "full": hits are announced again as KV events.
    full_report: bool = False
    # Multimodal items: (identifier, offset, length), sorted and disjoint,
    # inside the prompt; they key the hashes of the blocks they overlap.
    mm: tuple[tuple[str, int, int], ...] = ()
    # Prompt embeddings (the seed of harness/core/events.PromptEmbeds):
    # the prompt's token ids are then zeros and the embeddings key its blocks.
    embeds_seed: int | None = None


def items_inside(items: tuple[tuple[str, int, int], ...],
                 length: int) -> tuple[tuple[str, int, int], ...]:
    """The multimodal items that end within a prompt of `length` tokens (a
    trace refuses any other)."""
    return tuple(m for m in items if m[1] + m[2] <= length)


@dataclass(frozen=True, slots=True)
class Schedule:
    """Schedule up to `num_new_tokens` of the request's unscheduled tokens.

    A waiting request is looked up first (and may adopt `external` connector
    tokens, or load them asynchronously with delayed caching); a running one
    gets its next chunk or decode step.
    """

    req: int
    num_new_tokens: int
    lookahead: int = 0
    external: int = 0
    delay_cache: bool = False
    full_sequence_must_fit: bool = False
    reserved_blocks: int = 0
    # The lookup's bound, as a fraction of the request's tokens - 1 (None:
    # the default bound); used where the profile's lookup takes one (0.33).
    max_hit: float | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    """The model returns tokens for a request whose scheduled tokens are all
    computed (more than one: accepted speculative tokens)."""

    req: int
    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FinishLoad:
    """An asynchronous KV load finished: its blocks are cached now. A failed
    load (HiSparse: the connector reports it failed) frees the request and
    puts it back to waiting with nothing computed."""

    req: int
    failed: bool = False


@dataclass(frozen=True, slots=True)
class Ack:
    """HiSparse's workers report on the oldest `count` transfers in flight:
    each runs on `workers` workers; `split`: only one of them has finished it
    so far (the others report at a later Ack). Host copies handed out are
    reported done."""

    count: int
    workers: int = 1
    split: bool = False


@dataclass(frozen=True, slots=True)
class Finish:
    """The request finished or was aborted: its blocks are freed. A KV
    producer first takes its prompt-tail states (`finalize`, Mamba "align")."""

    req: int
    finalize: bool = False


@dataclass(frozen=True, slots=True)
class Preempt:
    """The scheduler preempts a running request (free and requeue)."""

    req: int


@dataclass(frozen=True, slots=True)
class Reset:
    pass


@dataclass(frozen=True, slots=True)
class Evict:
    block_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StepBoundary:
    pass


@dataclass(frozen=True, slots=True)
class Observe:
    """A checkpoint: free-queue order, free count, usage, stats, KV events."""


Action = (New | Schedule | Sample | FinishLoad | Finish | Preempt | Reset | Evict
          | StepBoundary | Observe | Ack)
