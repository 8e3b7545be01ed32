"""Differential fuzzing of the CPU offload tier: impl's manager against
vLLM's, answer by answer, over seeded programs (offload_program.py), with
the tier's invariants checked after every operation.

`python -m harness.fuzz.offload_driver --seconds 60 --seed 0` runs programs
until the time is up (or `--programs N`), prints the operations run and
every divergence, and exits 1 on a divergence, 3 when vLLM is missing.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field

from harness.backends.offload_base import POLICIES, OffloadBackend, OffloadConfig
from harness.backends.offload_impl import ImplOffloadBackend
from harness.core.exit_codes import ExitCode
from harness.fuzz.offload_program import Model, draw_config, program
from impl.kv_offload.invariants import violations
from impl.profiles import VersionProfile

PROGRAM_LENGTH = 300


@dataclass(frozen=True, slots=True)
class OffloadFuzzConfig:
    """A kind config's `offload:` mapping (harness/fuzz/kind_configs/
    offload_cpu_tier.yaml): the policies programs draw from."""

    cache_policies: tuple[str, ...] = POLICIES

    @property
    def kinds(self) -> tuple[str, ...]:
        """The fuzz templates it needs of a release (none: the offload tier only)."""
        return ()

    @classmethod
    def from_dict(cls, data: dict) -> OffloadFuzzConfig:
        unknown = sorted(set(data) - {"cache_policies"})
        if unknown:
            raise ValueError(f"offload: unknown field(s) {', '.join(unknown)} "
                             "(known: cache_policies)")
        policies = tuple(data.get("cache_policies", POLICIES))
        bad = [p for p in policies if p not in POLICIES]
        if bad or not policies:
            raise ValueError(f"offload: cache_policies: {bad or 'none'} (known: "
                             f"{', '.join(POLICIES)})")
        return cls(policies)


@dataclass(slots=True)
class Divergence:
    seed: int
    config: OffloadConfig
    index: int
    op: tuple
    field: str
    answers: dict

    def line(self) -> str:
        op = tuple(x.hex() if isinstance(x, bytes) else x for x in self.op[:2])
        return (f"offload program seed={self.seed} {self.config}: op #{self.index} {op}: "
                f"{self.field}: {self.answers}")


@dataclass(slots=True)
class FuzzResult:
    programs: int = 0
    ops: int = 0
    seconds: float = 0.0
    divergences: list[Divergence] = field(default_factory=list)
    by_op: dict[str, int] = field(default_factory=dict)


def _model_violations(backend: OffloadBackend, model: Model, op: tuple, answer) -> list[str]:
    """What the scheduler's view says must hold on either side: a pinned
    block is held with one ref per pin, a block being stored stays held and
    unreadable, and no prepare_store evicts either or a key it was offered."""
    out = []
    held = backend.held()
    if len(held) > backend.config.num_chunks:
        out.append(f"{backend.name}: {len(held)} chunks held over capacity")
    for key, pins in model.pins().items():
        state = held.get(key)
        if state is None or state[1] != pins:
            out.append(f"{backend.name}: key {key.hex()} pinned {pins}x, holds {state}")
    for key in model.storing():
        state = held.get(key)
        if state is None or state[1] != -1:
            out.append(f"{backend.name}: key {key.hex()} being stored, holds {state}")
    if op[0] == "prepare_store" and isinstance(answer, dict):
        evicted = {bytes.fromhex(h) for h in answer["evicted_keys"]}
        bad = evicted & (set(model.pins()) | set(op[2]))
        if bad:
            out.append(f"{backend.name}: evicted pinned or offered keys {[k.hex() for k in bad]}")
    return out


def run_program(seed: int, backends: list[OffloadBackend] | None = None,
                length: int = PROGRAM_LENGTH, vllm_factory=None,
                profile: VersionProfile | None = None,
                policies: tuple[str, ...] = POLICIES) -> tuple[int, Divergence | None, dict]:
    """One program on impl (with `profile`, the installed vLLM's by default)
    and vLLM, or on the given backends, reference first; (ops run, first
    divergence or None, ops by kind)."""
    rng = random.Random(seed)
    config = draw_config(rng, policies)
    if backends is None:
        factory = vllm_factory or _vllm_backend
        backends = [factory(config), ImplOffloadBackend(config, profile or _installed())]
    model = Model()
    gen = program(rng, config, length, model)
    by_op: dict[str, int] = {}
    index = 0
    try:
        op = next(gen)
        while True:
            answers = {b.name: b.run(op) for b in backends}
            by_op[op[0]] = by_op.get(op[0], 0) + 1
            reference = answers[backends[0].name]
            if any(a != reference for a in answers.values()):
                return index + 1, Divergence(seed, config, index, op, "answer", answers), by_op
            found = []
            for b in backends:
                found += _model_violations(b, model, op, reference)
                if isinstance(b, ImplOffloadBackend):
                    found += violations(b.manager)
            held = [b.held() for b in backends]
            if any(h != held[0] for h in held):
                found.append("held chunks (key -> slot, ref_cnt) differ")
            if found:
                return index + 1, Divergence(seed, config, index, op, "invariant",
                                             {"violations": found}), by_op
            index += 1
            op = gen.send(reference)
    except StopIteration:
        return index, None, by_op


def _installed() -> VersionProfile:
    from harness.backends.vllm_backend import installed_vllm_profile

    return installed_vllm_profile()


def _vllm_backend(config: OffloadConfig) -> OffloadBackend:
    from harness.backends.offload_vllm import VllmOffloadBackend

    return VllmOffloadBackend(config)


def fuzz(seed: int, seconds: float | None = None, programs: int | None = None,
         vllm_factory=None, stop_at_first: bool = True,
         profile: VersionProfile | None = None,
         fuzz_config: OffloadFuzzConfig | None = None) -> FuzzResult:
    result = FuzzResult()
    profile = profile or _installed()
    policies = (fuzz_config or OffloadFuzzConfig()).cache_policies
    if vllm_factory is None:
        # vLLM's tier imported before the clock starts: the import is not the campaign's.
        from harness.backends.offload_vllm import missing_vllm_offload

        if (missing := missing_vllm_offload()) is not None:
            raise ImportError(missing)
    start = time.monotonic()
    while True:
        if programs is not None and result.programs >= programs:
            break
        if seconds is not None and time.monotonic() - start >= seconds:
            break
        n, div, by_op = run_program(seed * 1_000_003 + result.programs,
                                    vllm_factory=vllm_factory, profile=profile,
                                    policies=policies)
        result.programs += 1
        result.ops += n
        for k, v in by_op.items():
            result.by_op[k] = result.by_op.get(k, 0) + v
        if div is not None:
            result.divergences.append(div)
            if stop_at_first:
                break
    result.seconds = time.monotonic() - start
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.fuzz.offload_driver",
                                     description="impl's CPU offload tier against vLLM's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--programs", type=int, default=None)
    args = parser.parse_args(argv)
    if args.seconds is None and args.programs is None:
        args.programs = 50
    from harness.backends.offload_vllm import missing_vllm_offload

    missing = missing_vllm_offload()
    if missing:
        print(f"offload fuzz: vLLM's offload manager cannot be imported: {missing}",
              file=sys.stderr)
        return ExitCode.ENVIRONMENT
    result = fuzz(args.seed, args.seconds, args.programs, stop_at_first=False)
    rate = result.ops / result.seconds if result.seconds else 0.0
    print(f"offload fuzz seed={args.seed}: {result.programs} programs, {result.ops} ops, "
          f"{result.seconds:.1f} s ({rate:,.0f} ops/s), {len(result.divergences)} divergences")
    print("ops: " + ", ".join(f"{k} {v}" for k, v in sorted(result.by_op.items())))
    for div in result.divergences[:10]:
        print(div.line())
    return ExitCode.DIVERGED if result.divergences else ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
