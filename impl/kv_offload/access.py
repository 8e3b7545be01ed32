"""A request's accesses to the offload cache, kept until it finishes, so the
policy learns of them once, in prefix order, at the end (specs/KV_OFFLOAD.md,
on_request_finished)."""

from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class RequestAccess:
    manager: object
    generation: int
    # group index -> keys in the order first observed
    by_group: dict[int, list[bytes]] = field(default_factory=dict)
    observed: set[bytes] = field(default_factory=set)
    inserted: set[bytes] = field(default_factory=set)
    reused: set[bytes] = field(default_factory=set)
    # keys already reported to the policy as store misses
    missed: set[bytes] = field(default_factory=set)
    done: bool = False

    def belongs_to(self, manager: object, generation: int) -> bool:
        return self.manager is manager and self.generation == generation
