"""Batches, block tables and slot mappings derived from a trace's allocations."""

import textwrap

from harness.attention.steps import iter_batches
from harness.trace import open_trace

TRACE = textwrap.dedent("""\
    header:
      format: kvconform-trace/1
      vllm_version: 0.32.0
      source: hand
      cache: {num_blocks: 16, groups: [{block_size: 4}]}
      model: {num_layers: 1, num_kv_heads: 2, head_size: 32, dtype: float32}
    events:
    - {op: add_request, req: a, prompt: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}
    - {op: step}
    - {op: lookup, req: a}
    - {op: allocate, req: a, num_new_tokens: 6}
    - {op: step}
    - {op: allocate, req: a, num_new_tokens: 4}
    - {op: append_tokens, req: a, tokens: [11]}
    - {op: add_request, req: b, prompt: [1, 2, 3, 4, 5, 6, 7, 8, 99]}
    - {op: step}
    - {op: allocate, req: a, num_new_tokens: 1}
    - {op: lookup, req: b}
    - {op: allocate, req: b, num_new_tokens: 1}
    - {op: preempt, req: b}
    - {op: append_tokens, req: a, tokens: [12]}
    - {op: add_request, req: c, prompt: [7, 7, 7, 7, 7]}
    - {op: step}
    - {op: lookup, req: c}
    - {op: allocate, req: c, num_new_tokens: 2, num_external_computed_tokens: 3}
    - {op: allocate, req: a, num_new_tokens: 1}
    - {op: free, req: a}
    """)


def _batches(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(TRACE)
    out = []
    for b in iter_batches(open_trace(str(path))):
        out.append({
            "step": b.step, "line": b.line,
            "scheduled": [(s.req_id, s.num_computed, s.num_new) for s in b.scheduled],
            "external": [(s.req_id, s.num_computed, s.num_new) for s in b.external],
            "rows": {r: list(b.tables[0].row(r)) for r in b.tables[0].rows},
            "slots": {s.req_id: [b.tables[0].row(s.req_id)[p // 4] * 4 + p % 4
                                 for p in s.positions] for s in b.scheduled},
            "hash_a": b.hashes("a", range(0, 8)) if "a" in b.hashers else None,
            "hash_b": b.hashes("b", range(0, 8)) if "b" in b.hashers else None,
        })
    return out


def test_batches_follow_steps_and_rows_grow(tmp_path):
    b = _batches(tmp_path)
    assert [x["step"] for x in b] == [0, 1, 2, 3]
    assert b[0]["scheduled"] == [("a", 0, 6)]
    first_allocation = TRACE.splitlines().index(
        "- {op: allocate, req: a, num_new_tokens: 6}") + 1
    assert b[0]["line"] == first_allocation
    assert b[1]["scheduled"] == [("a", 6, 4)]
    a0, a1 = b[0]["rows"]["a"], b[1]["rows"]["a"]
    assert len(a0) == 2 and a1[:2] == a0 and len(a1) == 3  # append-only
    assert b[1]["slots"]["a"] == [a1[1] * 4 + 2, a1[1] * 4 + 3, a1[2] * 4, a1[2] * 4 + 1]


def test_a_prefix_hit_starts_the_row_and_a_preempted_request_leaves_the_batch(tmp_path):
    b = _batches(tmp_path)
    # Step 2: b's hit was a's first two blocks; b is preempted within the step,
    # so it is not computed, and the batch is handed out before its blocks go.
    assert b[2]["scheduled"] == [("a", 10, 1)]
    assert b[2]["rows"]["b"][:2] == b[2]["rows"]["a"][:2]
    assert b[2]["hash_a"] == b[2]["hash_b"]  # same prefix, same rows
    assert "b" not in b[3]["rows"]


def test_connector_tokens_are_written_not_queried_and_free_flushes(tmp_path):
    b = _batches(tmp_path)
    step3 = b[3]
    assert step3["external"] == [("c", 0, 3)]
    assert step3["scheduled"] == [("c", 3, 2), ("a", 11, 1)]
    # c's row holds a block for the connector's tokens though the allocation's
    # answer names only the block of its new tokens.
    assert len(step3["rows"]["c"]) == 2
    assert step3["slots"]["c"] == [step3["rows"]["c"][0] * 4 + 3, step3["rows"]["c"][1] * 4]
    assert len(b) == 4  # the free handed out the trace's last batch
