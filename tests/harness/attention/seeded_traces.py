"""Seeded traces for the attention tests, written with impl's answers."""

from __future__ import annotations

from harness.backends.impl_backend import ImplBackend
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.core.events import AddRequest, Allocate, AppendTokens, Free, Lookup, Step
from harness.trace import ModelShape, TraceHeader, TraceWriter
from impl.profiles import get_profile

LONG_CONTEXT = 4096


def write_long_context_trace(path: str, window: int = 64) -> str:
    """A hybrid (full + sliding window) bf16 trace at 4k context.

    'long' brings 4,096 tokens from a KV connector (written, not queried) and
    decodes from position 4,096 on, so its queries see 4,097 keys and more:
    a key-tile loop (128 keys a tile interpreted) whose last tile holds only
    the newest key. 'chat' prefills 300 tokens in one chunk (causal masks,
    windows and tiles across a prefill), then decodes beside 'long'.
    """
    cache = CacheConfig(num_blocks=300, groups=(
        GroupConfig(32), GroupConfig(32, "sliding_window", sliding_window=window)),
        max_model_len=8192)
    profile = get_profile("0.32")
    backend = ImplBackend(cache, profile)
    writer = TraceWriter(path, TraceHeader(
        "0.32.0", "hand", cache, description="seeded 4k-context trace (tests)",
        model=ModelShape(1, 2, 64, "bfloat16")))
    long_prompt = [(7 * i + 3) % 1000 for i in range(LONG_CONTEXT + 8)]
    chat_prompt = [(11 * i + 5) % 1000 for i in range(300)]
    events = [AddRequest("long", long_prompt), AddRequest("chat", chat_prompt), Step(),
              Lookup("long"), Allocate("long", 1, num_external_computed_tokens=LONG_CONTEXT),
              Lookup("chat"), Allocate("chat", 300), Step()]
    for t in range(4):
        events += [AppendTokens("long", [t + 1]), AppendTokens("chat", [t + 2]),
                   Allocate("long", 1), Allocate("chat", 1), Step()]
    events += [Free("long"), Free("chat")]
    for ev in events:
        writer.write(ev, backend.run(ev))
    writer.close()
    return path


def write_kind_trace(path: str, group: GroupConfig, version: str = "0.32.0",
                     head_size: int = 64) -> str:
    """One group of `group`'s kind: two requests sharing a 48-token prefix
    (the second hits the first's blocks), prefills in chunks of at most 50
    tokens after whatever the lookup hits, then decodes side by side."""
    cache = CacheConfig(num_blocks=40, groups=(group,), max_model_len=1024)
    profile = get_profile(version)
    backend = ImplBackend(cache, profile)
    writer = TraceWriter(path, TraceHeader(
        version, "hand", cache, description=f"seeded {group.kind} trace (tests)",
        model=ModelShape(1, 2, head_size, "float32")))

    def run(ev):
        answer = backend.run(ev)
        writer.write(ev, answer)
        return answer

    shared = [(13 * i + 1) % 500 for i in range(48)]
    prompts = {"a": shared + [7] * 40, "b": shared + [9] * 5}
    for req, prompt in prompts.items():
        run(AddRequest(req, prompt))
        done = run(Lookup(req))["hit_tokens"]
        while done < len(prompt):
            n = min(50, len(prompt) - done)
            run(Allocate(req, n))
            run(Step())
            done += n
    for t in range(4):
        for req in prompts:
            run(AppendTokens(req, [t + 1]))
            run(Allocate(req, 1))
        run(Step())
    for req in prompts:
        run(Free(req))
    writer.close()
    return path
