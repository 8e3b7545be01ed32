"""A stand-in for the model: what a model runner would return for a scheduled step.

A request whose scheduled tokens reach the end of what it has (a decode step,
or the last chunk of its prefill) gets one sampled token, drawn from a seeded
RNG; a request in the middle of a chunked prefill gets none, as the real model
runner discards those samples.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class FakeModel:
    vocab: int
    seed: int = 0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed ^ 0x5EED)

    def execute(self, scheduler, scheduler_output):
        from vllm.v1.outputs import ModelRunnerOutput

        req_ids = list(scheduler_output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in req_ids:
            request = scheduler.requests[rid]
            # The scheduler has already advanced num_computed_tokens by this step.
            done_prefill = request.num_computed_tokens >= request.num_tokens
            sampled.append([self.rng.randrange(self.vocab)] if done_prefill else [])
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )
