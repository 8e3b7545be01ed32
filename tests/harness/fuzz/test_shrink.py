from harness.core.cache_config import CacheConfig, GroupConfig
from harness.fuzz.actions import Finish, New, Observe, Sample, Schedule
from harness.fuzz.shrink import shrink


def test_shrinks_to_what_the_predicate_needs():
    config = CacheConfig(num_blocks=64, groups=(GroupConfig(4),))
    actions = [New(0, tuple(range(9))), Schedule(0, 4096, lookahead=3), Sample(0, (1, 2)),
               New(1, (5, 5, 5)), Schedule(1, 2), Finish(0), Observe()]

    def fails(c, a):  # "fails" while request 0 is scheduled and the pool >= 5
        return c.num_blocks >= 5 and any(isinstance(x, Schedule) and x.req == 0 for x in a) \
            and any(isinstance(x, New) and x.req == 0 for x in a)

    small_config, small = shrink(config, actions, fails)
    assert small_config.num_blocks == 5
    assert small_config.groups[0].block_size == 1
    assert small == [New(0, (0,)), Schedule(0, 4096)]


def test_a_shorter_prompt_keeps_only_the_items_inside_it():
    # A trace refuses items past the prompt: every candidate the shrinker
    # tries must stay writable (the Ray campaign's findings failed to replay).
    config = CacheConfig(num_blocks=8, groups=(GroupConfig(4),))
    new = New(0, tuple(range(8)), mm=(("img-0", 0, 2), ("img-1", 5, 3)), embeds_seed=1)
    tried = []

    def fails(c, a):
        tried.extend(x for x in a if isinstance(x, New))
        return any(isinstance(x, New) and x.mm[:1] == (("img-0", 0, 2),) for x in a)

    _, small = shrink(config, [new], fails)
    assert all(m[1] + m[2] <= len(x.prompt) for x in tried for m in x.mm)
    assert small[0].mm == (("img-0", 0, 2),) and len(small[0].prompt) < 8
