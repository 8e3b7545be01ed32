"""`kvconform consumer-check`: the reference consumer agrees with the engine
after every published batch; the three negative controls (drops parent
hashes, ignores the group id, decodes only the array layout) are each caught,
named at the step; the wire format is vLLM 0.32's (decoded with vLLM's own
structs); a hung consumer is bounded by the timeout."""

import os
import subprocess
import sys

import pytest

from harness.backends.exec_backend import TIMEOUT_ENV
from harness.consumer.check import check_consumer
from harness.consumer.publisher import wire_event
from harness.core.exit_codes import ExitCode
from impl.kv_events import BlockRemoved, BlockStored

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE = os.path.join(ROOT, "examples", "kv-event-consumer", "reference_consumer.py")
CONSUMER = f"{sys.executable} {REFERENCE}"
EXAMPLE = os.path.join(ROOT, "traces", "scenarios", "documented-example.yaml")
TWO_GROUPS = os.path.join(ROOT, "traces", "scenarios", "eagle-replicated-draft.yaml")


@pytest.mark.parametrize("trace", [EXAMPLE, TWO_GROUPS])
def test_the_reference_consumer_agrees(trace):
    r = check_consumer(CONSUMER, trace)
    assert r.exit_code == ExitCode.OK, r.message
    assert r.batches >= 2 and r.queries >= r.batches


@pytest.mark.parametrize("bug, trace, step", [
    ("drop-parent", EXAMPLE, "event #4 (allocate): batch 1"),
    ("array-only", EXAMPLE, "event #2 (allocate): batch 0"),
    ("ignore-group", TWO_GROUPS, "query a/g0 (request a, group 0)"),
])
def test_each_negative_control_is_caught(bug, trace, step):
    r = check_consumer(f"{CONSUMER} --bug {bug}", trace)
    assert r.exit_code == ExitCode.DIVERGED, r.message
    assert step in r.message and "the consumer believes" in r.message


@pytest.mark.vllm
def test_the_payload_decodes_with_vllm_s_own_structs():
    """What the publisher sends is what vLLM 0.32's subscribers decode."""
    import msgspec
    from vllm.distributed.kv_events import KVEventBatch

    stored = BlockStored([7, 8], 6, [1, 2, 3, 4], 2, None, "GPU", None, [None, None], 0,
                         "full_attention")
    payload = msgspec.msgpack.encode([1.5, [wire_event(stored, True),
                                            wire_event(BlockRemoved([7], "GPU", 0), True)], 0])
    batch = msgspec.msgpack.decode(payload, type=KVEventBatch)
    first, second = batch.events
    assert (first.block_hashes, first.parent_block_hash, first.group_idx) == ([7, 8], 6, 0)
    assert type(second).__name__ == "BlockRemoved" and batch.data_parallel_rank == 0
    assert msgspec.msgpack.encode(batch) == payload  # byte for byte vLLM's encoding


def test_a_hung_consumer_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "0.5")
    script = tmp_path / "hang.py"
    script.write_text("import json,sys,time\nprint(json.dumps({'kvconform_consumer': 1}), "
                      "flush=True)\ntime.sleep(3600)\n")
    r = check_consumer(f"{sys.executable} {script}", EXAMPLE)
    assert r.exit_code == ExitCode.ENVIRONMENT
    assert "no answer within 0.5 s at subscribe" in r.message


def test_cli_writes_a_result_page(tmp_path):
    out = tmp_path / "page"
    cmd = [sys.executable, "-m", "harness.cli.main", "consumer-check", "--cmd",
           f"{CONSUMER} --bug drop-parent", EXAMPLE, "--page", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == ExitCode.DIVERGED, r.stdout + r.stderr
    md = (out / "index.md").read_text()
    assert "1 of 1 checked cases failed" in md and "What failed" in md
    assert "the consumer believes" in (out / "index.html").read_text()
