"""The peer pipeline on a small vLLM-style test module, live: vLLM's names
rebound to impl inside the module, impl calls counted, and the negative
controls: a test that never reaches impl, one whose answers come from vLLM's
own KV cache code, and an injected impl bug that the impl-backed tests catch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.peer import classify
from harness.peer.classify import FAILED, NOT_APPLICABLE, PASSED

pytestmark = pytest.mark.vllm

# Written in vLLM's own test style: vLLM's names, vLLM's expected answers.
SAMPLE = textwrap.dedent('''
    import importlib

    import torch

    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request


    def _manager(num_blocks=10):
        config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=4, num_kv_heads=1,
                                                          head_size=1, dtype=torch.float32))])
        return KVCacheManager(config, max_model_len=64, scheduler_block_size=4,
                              hash_block_size=4)


    def _request(rid, tokens):
        init_none_hash(sha256)
        params = SamplingParams(max_tokens=4)
        params.update_from_generation_config({}, eos_token_id=100)
        return Request(request_id=rid, prompt_token_ids=tokens, sampling_params=params,
                       pooling_params=None, block_hasher=get_request_block_hasher(4, sha256))


    def test_prefix_hit():
        manager = _manager()
        first = _request("0", list(range(10)))
        blocks, hits, _ = manager.get_computed_blocks(first)
        assert hits == 0
        assert manager.allocate_slots(first, 10, hits, blocks).get_block_ids() == ([1, 2, 3],)
        manager.free(first)
        second = _request("1", list(range(9)) + [99])
        blocks, hits, _ = manager.get_computed_blocks(second)
        assert hits == 8
        assert blocks.get_block_ids() == ([1, 2],)


    def test_never_reaches_impl():
        assert sorted([3, 1, 2]) == [1, 2, 3]


    def test_answers_from_vllm():
        # vLLM's own BlockPool, fetched past the test module's names.
        pool = importlib.import_module("vllm.v1.core.block_pool").BlockPool(
            num_gpu_blocks=5, enable_caching=True, hash_block_size=4)
        assert pool.get_num_free_blocks() == 4
        _manager()


    def _vllm_spec():
        # vLLM's own spec class, fetched past the test module's names.
        spec_cls = importlib.import_module("vllm.v1.kv_cache_interface").FullAttentionSpec
        return spec_cls(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32)


    def test_reads_what_a_spec_is():
        # What a connector reads of the test's config: not an answer.
        assert _vllm_spec().prefix_cacheable
        test_prefix_hit()


    def test_reads_a_sizing_answer_from_vllm():
        assert _vllm_spec().page_size_bytes == 32
        test_prefix_hit()
''')

# Loaded into the impl run only when KVCONFORM_TEST_INJECT is set: prefix
# lookups find one block fewer than they should.
INJECT = textwrap.dedent('''
    import os

    if os.environ.get("KVCONFORM_TEST_INJECT"):
        # One group's lookup (impl's unitary coordinator scans the map itself).
        from impl.coordinator import UnitaryKVCacheCoordinator

        original = UnitaryKVCacheCoordinator.find_longest_cache_hit

        def buggy(self, *args, **kwargs):
            blocks, length = original(self, *args, **kwargs)
            if length:
                for group in blocks:
                    del group[-1:]
                length -= self.block_size
            return blocks, length

        UnitaryKVCacheCoordinator.find_longest_cache_hit = buggy
''')


def _run(tmp_path: Path, mode: str, inject: bool = False) -> dict[str, dict]:
    (tmp_path / "test_peer_sample.py").write_text(SAMPLE)
    (tmp_path / "conftest.py").write_text(INJECT)
    records = tmp_path / f"{mode}{'-injected' if inject else ''}.jsonl"
    env = dict(os.environ, KVCONFORM_PEER_MODE=mode, KVCONFORM_PEER_RECORDS=str(records))
    env.pop("KVCONFORM_TEST_INJECT", None)
    if inject:
        env["KVCONFORM_TEST_INJECT"] = "1"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:kvconform",
         "-p", "harness.peer.plugin", "--rootdir", str(tmp_path), "-W", "ignore",
         "test_peer_sample.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )
    out = {}
    for line in records.read_text().splitlines():
        rec = json.loads(line)
        out[rec["nodeid"].split("::")[1]] = rec
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("peer")
    return {name: _run(tmp, mode, inject) for name, mode, inject in
            (("vllm", "vllm", False), ("impl", "impl", False), ("bug", "impl", True))}


def test_every_sample_test_passes_on_vllm(runs):
    assert {name: r["outcome"] for name, r in runs["vllm"].items()} == {
        "test_prefix_hit": "passed", "test_never_reaches_impl": "passed",
        "test_answers_from_vllm": "passed", "test_reads_what_a_spec_is": "passed",
        "test_reads_a_sizing_answer_from_vllm": "passed"}


def test_impl_answers_the_prefix_hit_test(runs):
    rec = runs["impl"]["test_prefix_hit"]
    assert rec["outcome"] == "passed" and rec["impl_calls"] > 0 and rec["vllm_kv_calls"] == 0
    assert classify.verdict_on_impl(rec)[0] == PASSED


def test_a_test_that_never_reaches_impl_is_not_applicable(runs):
    rec = runs["impl"]["test_never_reaches_impl"]
    assert rec["outcome"] == "passed"
    assert classify.verdict_on_impl(rec)[:2] == (NOT_APPLICABLE, "never reaches impl")


def test_a_test_answered_by_vllm_code_is_not_applicable(runs):
    rec = runs["impl"]["test_answers_from_vllm"]
    assert rec["outcome"] == "passed" and rec["impl_calls"] > 0
    verdict, reason, _ = classify.verdict_on_impl(rec)
    assert verdict == NOT_APPLICABLE and "vLLM's own KV cache code" in reason


def test_an_injected_impl_bug_fails_the_impl_backed_test(runs):
    rec = runs["bug"]["test_prefix_hit"]
    assert rec["outcome"] == "failed"
    assert classify.verdict_on_impl(rec)[0] == FAILED
    # ... and only that one: the controls do not depend on impl's answers.
    assert runs["bug"]["test_never_reaches_impl"]["outcome"] == "passed"


def test_reading_what_a_spec_is_does_not_count_as_vllm_answering(runs):
    """prefix_cacheable describes the test's input; a sizing answer
    (page_size_bytes) from vLLM's spec still makes the test not applicable."""
    rec = runs["impl"]["test_reads_what_a_spec_is"]
    assert rec["outcome"] == "passed" and rec["vllm_kv_calls"] == 0
    assert classify.verdict_on_impl(rec)[0] == PASSED
    sized = runs["impl"]["test_reads_a_sizing_answer_from_vllm"]
    assert sized["outcome"] == "passed" and sized["vllm_kv_calls"] > 0
    assert classify.verdict_on_impl(sized)[0] == NOT_APPLICABLE


def test_a_file_that_does_not_import_costs_only_its_own_tests(tmp_path):
    """Under xdist a test named by node id in a file that fails to import
    stops every test of the run (as vLLM 0.31's test_gpu_input_batch.py on
    its overlay; the negative control shows it); the peer pass reruns the
    others and keeps the broken file's collection record."""
    from harness.peer.run import load, run_collectable, run_pass, uncollectable

    (tmp_path / "test_good.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    (tmp_path / "test_broken.py").write_text("import a_module_no_release_has\n\n"
                                             "def test_rows():\n    pass\n")
    tests = ["test_good.py", "test_broken.py::test_rows"]
    plain = tmp_path / "plain.jsonl"
    run_pass("vllm", tmp_path, plain, {}, "2", tests)
    assert "test_good.py::test_one" not in load(plain)   # why run_collectable exists
    records = tmp_path / "records.jsonl"
    assert run_collectable("vllm", tmp_path, records, {}, "2", tests) == ["test_good.py"]
    got = load(records)
    assert got["test_good.py::test_one"]["outcome"] == "passed"
    assert uncollectable(records) == {"test_broken.py"}
