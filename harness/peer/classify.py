"""Every test's verdict on impl, with its reason.

Only tests that pass on vLLM count. On impl a test is
- passed: it passed, made calls into impl, and none into vLLM's own KV cache
  code (so the answers it checked came from impl);
- failed: it failed; the reason is the feature impl lacks (an adapter raised
  ImplLacks, impl raised NotImplementedError, or a test-by-test finding in
  `findings.py`), a public API name impl lacks, or the failure itself;
- not applicable: it passed without reaching impl, or its answers came
  (partly) from vLLM's KV cache code, or it failed only on a vLLM-private
  name (a leading underscore) or on a finding marked not applicable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.peer import features as F
from harness.peer import findings

PASSED, FAILED, NOT_APPLICABLE = "passed", "failed", "not_applicable"

# impl's NotImplementedError messages -> the feature they mean.
_NOT_IMPLEMENTED = (
    (re.compile(r"speculative blocks (in|with) Mamba 'align'"), F.MAMBA_SPEC_ALIGN),
    (re.compile(r"packed groups"), F.PACKED_GROUPS),
    (re.compile(r"cannot be padded"), F.FULL_ALLOCATION_FALLBACK),
)

# Public API names impl lacks -> the feature they belong to (else "API: name").
API_FEATURES = {
    "pop_blocks_for_free": F.DEFERRED_FREES,
    "truncate_computed_blocks": F.DEFERRED_FREES,
    "emit_cached_block_events": F.REPORT_MODE_FULL,
    "take_new_block_ids": F.ZEROING,
    "record_blocks_for_zeroing": F.ZEROING,
    "take_boundary_state_offloads": F.BOUNDARY_OFFLOADS,
    "get_num_common_prefix_blocks": F.COMMON_PREFIX,
    "get_computed_blocks_for_connector": F.CONNECTOR_LOOKUP,
    "use_eagle": F.EAGLE,
    "set_block_hash": F.BLOCK_API,
    "reset_hash": F.BLOCK_API,
}


@dataclass(slots=True)
class Verdict:
    nodeid: str
    file: str
    vllm: str  # passed / failed / skipped on vLLM
    impl: str | None  # PASSED / FAILED / NOT_APPLICABLE, None if not run on impl
    reason: str = ""
    feature: str | None = None  # set when the reason is a feature impl lacks
    # Every feature the adapters found the test needs (the first is `feature`).
    needs: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {"nodeid": self.nodeid, "file": self.file, "vllm": self.vllm, "impl": self.impl,
                "reason": self.reason, "feature": self.feature, "needs": list(self.needs)}


def test_file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _api_reason(api: str) -> tuple[str, str | None, str]:
    """(verdict, feature, reason) for a missing API name `Owner.name`."""
    name = api.rsplit(".", 1)[-1]
    if name.startswith("_"):
        return NOT_APPLICABLE, None, f"reads vLLM-private {api}"
    feature = API_FEATURES.get(name.split(" ")[0])
    if feature is not None:
        return FAILED, feature, f"impl lacks {feature} ({api})"
    return FAILED, f"API: {api}", f"impl's public API lacks {api}"


def verdict_on_impl(rec: dict) -> tuple[str, str, str | None]:
    """(verdict, reason, feature) for one impl-run record."""
    exc = rec.get("exc") or {}
    name = rec["nodeid"].split("::", 1)[-1]
    finding = findings.lookup(name)
    if rec["outcome"] == "passed":
        seen = rec.get("lacks_seen") or []
        if seen:
            # Passed only because the test expected an error and an adapter's
            # refusal (ImplLacks is an AttributeError for missing names) was one.
            feat, detail = seen[0]
            if feat == "API":
                verdict, feature, reason = _api_reason(detail)
                return verdict, reason, feature
            return FAILED, f"impl lacks {feat} ({detail})", feat
        if not rec.get("impl_calls"):
            if finding is not None and finding.verdict == NOT_APPLICABLE:
                return NOT_APPLICABLE, f"never reaches impl: {finding.reason}", None
            return NOT_APPLICABLE, "never reaches impl", None
        if rec.get("vllm_kv_calls"):
            first = (rec.get("vllm_kv_top") or [["?"]])[0][0]
            return NOT_APPLICABLE, f"answers come from vLLM's own KV cache code ({first})", None
        return PASSED, "", None
    if rec["outcome"] == "skipped":
        return NOT_APPLICABLE, f"skipped: {rec.get('skip_reason', '')}", None
    api = exc.get("missing_api")
    if api:
        verdict, feature, reason = _api_reason(api)
        return verdict, reason, feature
    feature = exc.get("lacks")
    if feature:
        detail = exc.get("lacks_detail")
        return FAILED, f"impl lacks {feature}" + (f" ({detail})" if detail else ""), feature
    if exc.get("exc_type") == "NotImplementedError":
        for pattern, feat in _NOT_IMPLEMENTED:
            if pattern.search(exc.get("message", "")):
                return FAILED, f"impl lacks {feat} (impl raises NotImplementedError)", feat
    seen = rec.get("lacks_seen") or []
    if seen:
        feat, detail = seen[0]
        if feat == "API":
            verdict, feature, reason = _api_reason(detail)
            return verdict, reason, feature
        return FAILED, f"impl lacks {feat} ({detail})", feat
    if finding is not None:
        return finding.verdict, finding.reason, finding.feature
    where = exc.get("where", "").rsplit("/", 1)[-1]
    return FAILED, (f"unclassified: {exc.get('exc_type', '?')} at {where}: "
                    f"{exc.get('message', '')[:160]}"), None


def features_needed(rec: dict, first: str | None) -> tuple[str, ...]:
    """The features impl lacks that a test ran into (each adapter check of
    its inputs is made before refusing them), the blocking one first."""
    out = [first] if first else []
    for feat, detail in rec.get("lacks_seen") or []:
        if feat == "API":
            verdict, feat, _ = _api_reason(detail)
            if verdict != FAILED:
                continue
        if feat not in out:
            out.append(feat)
    return tuple(out)


def classify(vllm_records: dict[str, dict], impl_records: dict[str, dict]) -> list[Verdict]:
    out = []
    for nodeid, vrec in vllm_records.items():
        v = Verdict(nodeid, test_file(nodeid), vrec["outcome"], None)
        if vrec["outcome"] == "passed":
            irec = impl_records.get(nodeid)
            if irec is None:
                v.impl, v.reason = FAILED, "not run on impl (collection or worker failure)"
            else:
                v.impl, v.reason, v.feature = verdict_on_impl(irec)
                if v.impl == FAILED:
                    v.needs = features_needed(irec, v.feature)
        out.append(v)
    return out
