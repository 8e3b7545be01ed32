"""The classifier: which impl-run records count as impl passing."""

from __future__ import annotations

from harness.peer import classify, summary
from harness.peer.classify import FAILED, NOT_APPLICABLE, PASSED


def _rec(nodeid="tests/v1/core/test_x.py::test_a", outcome="passed", **kw):
    return {"nodeid": nodeid, "outcome": outcome, **kw}


def test_a_pass_that_reached_impl_only_counts():
    assert classify.verdict_on_impl(_rec(impl_calls=12, vllm_kv_calls=0))[0] == PASSED


def test_a_pass_that_never_reached_impl_is_not_applicable():
    verdict, reason, _ = classify.verdict_on_impl(_rec(impl_calls=0, vllm_kv_calls=0))
    assert (verdict, reason) == (NOT_APPLICABLE, "never reaches impl")


def test_a_pass_with_answers_from_vllm_code_is_not_applicable():
    rec = _rec(impl_calls=40, vllm_kv_calls=3, vllm_kv_top=[["BlockPool.touch", 3]])
    verdict, reason, _ = classify.verdict_on_impl(rec)
    assert verdict == NOT_APPLICABLE and "BlockPool.touch" in reason


def test_a_missing_feature_is_a_failure_named_by_the_feature():
    rec = _rec(outcome="failed", impl_calls=5,
               exc={"exc_type": "ImplLacks", "lacks": "HiSparse", "lacks_detail": "x"})
    verdict, _, feature = classify.verdict_on_impl(rec)
    assert (verdict, feature) == (FAILED, "HiSparse")


def test_a_private_vllm_name_is_not_applicable_a_public_one_fails():
    private = _rec(outcome="failed", exc={"lacks": "API", "missing_api": "BlockPool._cache"})
    public = _rec(outcome="failed", exc={"lacks": "API", "missing_api": "KVCacheManager.foo"})
    assert classify.verdict_on_impl(private)[0] == NOT_APPLICABLE
    assert classify.verdict_on_impl(public)[:1] == (FAILED,)
    assert classify.verdict_on_impl(public)[2] == "API: KVCacheManager.foo"


def test_a_known_api_name_maps_to_its_feature():
    rec = _rec(outcome="failed", exc={"lacks": "API",
                                      "missing_api": "KVCacheManager.pop_blocks_for_free"})
    assert classify.verdict_on_impl(rec)[2] == "deferred frees / truncation"


def test_an_assertion_failure_without_a_finding_is_unclassified_not_hidden():
    rec = _rec(outcome="failed", impl_calls=3,
               exc={"exc_type": "AssertionError", "message": "assert 1 == 2", "where": "t.py:3"})
    verdict, reason, feature = classify.verdict_on_impl(rec)
    assert verdict == FAILED and feature is None and reason.startswith("unclassified")


def test_only_tests_passing_on_vllm_count_and_summary_has_the_issue_shape():
    vllm = {"f.py::a": _rec("f.py::a"), "f.py::b": _rec("f.py::b", "failed"),
            "f.py::c": _rec("f.py::c")}
    impl = {"f.py::a": _rec("f.py::a", impl_calls=1),
            "f.py::b": _rec("f.py::b", impl_calls=1),
            "f.py::c": _rec("f.py::c", impl_calls=0)}
    s = summary.summarize("0.32.0", classify.classify(vllm, impl))
    assert set(s) == {"vllm_version", "vllm_passed", "impl_passed", "impl_failed",
                      "not_applicable", "files"}
    assert (s["vllm_passed"], s["impl_passed"], s["impl_failed"]) == (2, 1, 0)
    assert s["not_applicable"] == {"never reaches impl": 1}
    assert s["files"]["f.py"]["vllm_failed"] == 1


def test_a_pass_that_only_caught_an_adapter_refusal_is_not_a_pass():
    rec = _rec(impl_calls=3, vllm_kv_calls=0, lacks_seen=[["API", "BlockPool.foo"]])
    assert classify.verdict_on_impl(rec)[0] == FAILED
