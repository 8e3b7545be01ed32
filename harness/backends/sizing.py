"""The sizing differential: one model shape sized by impl and by the
installed vLLM, the answers compared field by field (specs/SIZING.md).

vLLM is the reference: its answer is checked first against what the shape
expects (a trace's recorded num_blocks), then impl's against it. The first
differing field names the difference, e.g. `workers[1].tensors[0].size`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from harness.core.compare import first_difference
from harness.core.exit_codes import ExitCode
from harness.core.sizing_shape import SizingShape


@dataclass(slots=True)
class SizingOutcome:
    shape: SizingShape
    vllm: dict
    impl: dict
    seconds: float
    # The first differing field ("" for the root), None when they agree.
    field: str | None = None
    # What went wrong besides a difference with impl (an expectation vLLM
    # did not meet).
    problem: str = ""

    @property
    def crashed(self) -> bool:
        """vLLM raised something other than a refusal (a bug of its own on a
        shape it should plan), or cannot build the shape's specs (a field the
        release lacks): nothing to compare impl with."""
        return "crashed" in self.vllm or "lacks" in self.vllm

    @property
    def exit_code(self) -> ExitCode:
        if self.crashed:
            return ExitCode.ENVIRONMENT
        return ExitCode.OK if self.field is None and not self.problem else ExitCode.DIVERGED

    @property
    def num_fields(self) -> int:
        """The fields compared (the reference's answer's leaves)."""
        return _leaves(self.vllm)

    @property
    def refused(self) -> bool:
        return "refused" in self.vllm

    def mode(self) -> str:
        """What the shape exercised: its groups and blocks, or the refusal."""
        if "lacks" in self.vllm:
            return "not built by this vLLM"
        if self.crashed:
            return f"vLLM crashed at {self.vllm['crashed']['at']}"
        if self.refused:
            r = self.vllm["refused"]
            return f"refused at {r['at']} ({r['error']})"
        workers = self.vllm["workers"]
        groups = len(workers[0]["groups"]) if workers else 0
        return (f"{len(workers)} worker(s), {groups} group(s), "
                f"{self.vllm['scheduler']['num_blocks']} blocks")

    def report(self) -> str:
        if self.exit_code == ExitCode.OK:
            return ""
        where = f"{self.shape.where}: " if self.shape.where else ""
        if "lacks" in self.vllm:
            return (f"{where}sizing shape {self.shape.name}: this vLLM cannot build it: "
                    f"{self.vllm['lacks']['message']} (not compared)")
        if self.crashed:
            c = self.vllm["crashed"]
            return (f"{where}sizing shape {self.shape.name}: vLLM crashed at {c['at']}: "
                    f"{c['error']}: {c['message']} (not compared)")
        if self.problem:
            return f"{where}sizing shape {self.shape.name}: {self.problem}"
        return (f"{where}sizing shape {self.shape.name}: diverged at field "
                f"{self.field or '(answer)'}\n  vllm: {_at(self.vllm, self.field)}\n"
                f"  impl: {_at(self.impl, self.field)}")


def _leaves(value) -> int:
    if isinstance(value, dict):
        return sum(_leaves(v) for v in value.values())
    if isinstance(value, list):
        return sum(_leaves(v) for v in value) if value else 1
    return 1


def _at(answer, path: str | None):
    """The value at `path` (a.b[2].c) of an answer, or '(none)'."""
    value = answer
    for part in (path or "").replace("[", ".[").split("."):
        if not part:
            continue
        try:
            value = value[int(part[1:-1])] if part.startswith("[") else value[part]
        except (KeyError, IndexError, TypeError):
            return "(none)"
    return value


def _unmet(answer: dict, expect) -> str:
    for path, want in expect:
        got = _at(answer, path)
        if got != want:
            return f"vLLM's {path} is {got}, the shape expects {want}"
    return ""


def _compared(answer: dict) -> dict:
    """What is compared of an answer: a refusal by its stage only (which
    exception each side raises is its own; vLLM asserts where impl may raise
    ValueError for the same shape, e.g. a packed grouping that leaves layers
    out, specs/SIZING.md)."""
    if "refused" not in answer:
        return answer
    return {**answer, "refused": {"at": answer["refused"]["at"]}}


def check_sizing(shape: SizingShape, profile=None, api=None) -> SizingOutcome:
    """Both sides' answers for `shape` (the installed vLLM's profile and API
    shape unless given), compared."""
    from harness.backends.impl_sizing import impl_sizing, worker_memory
    from harness.backends.vllm_backend import installed_vllm_api, installed_vllm_profile
    from harness.backends.vllm_sizing import resolves_block_sizes, vllm_sizing

    profile = profile or installed_vllm_profile()
    api = api or installed_vllm_api()
    t0 = time.perf_counter()
    memory = worker_memory(shape, profile)
    theirs = vllm_sizing(shape, api, memory)
    mine = impl_sizing(shape, profile, memory)
    if not resolves_block_sizes(api):
        mine.get("scheduler", {}).pop("block_sizes", None)  # the release has no such answer
    outcome = SizingOutcome(shape, theirs, mine, time.perf_counter() - t0,
                            None if "crashed" in theirs or "lacks" in theirs else
                            first_difference(_compared(theirs), _compared(mine)))
    if outcome.field is None and "refused" not in theirs:
        outcome.problem = _unmet(theirs, shape.expect)
    return outcome
