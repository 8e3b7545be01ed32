"""The attention differential over traces: impl vs the float64 reference vs
vLLM's CPU attention, and that it notices what it must notice."""

import json
import textwrap
from pathlib import Path

import pytest
import torch

import harness.attention.impl_call as impl_call
import harness.attention.steps as steps
from harness.attention.differential import AttentionOptions, check_attention, wants_attention
from harness.attention.seeded import STREAM_KEY, STREAM_QUERY, STREAM_VALUE, seeded_rows
from harness.attention.steps import iter_batches
from harness.backends.impl_backend import ImplBackend
from harness.core.cache_config import CacheConfig, GroupConfig
from harness.sources.workload import SchedulerWorkload, WorkloadSpec, drive
from harness.trace import ModelShape, TraceHeader, TraceWriter, open_trace
from impl.profiles import get_profile

PROMPT = list(range(100, 164))  # 64 tokens: 4 blocks of 16
HAND = textwrap.dedent(f"""\
    header:
      format: kvconform-trace/1
      vllm_version: 0.32.0
      source: hand
      cache:
        num_blocks: 24
        groups: [{{block_size: 16}}, {{block_size: 16, kind: sliding_window, sliding_window: 24}}]
      model: {{num_layers: 1, num_kv_heads: 2, head_size: 32, dtype: float16}}
    events:
    - {{op: add_request, req: a, prompt: {PROMPT}}}
    - {{op: step}}
    - {{op: lookup, req: a}}
    - {{op: allocate, req: a, num_new_tokens: 40}}
    - {{op: step}}
    - {{op: allocate, req: a, num_new_tokens: 24}}
    - {{op: append_tokens, req: a, tokens: [7]}}
    - {{op: add_request, req: b, prompt: {PROMPT + [1, 2, 3, 4, 5]}}}
    - {{op: step}}
    - {{op: allocate, req: a, num_new_tokens: 1}}
    - {{op: lookup, req: b}}
    - {{op: allocate, req: b, num_new_tokens: 5}}
    - {{op: append_tokens, req: a, tokens: [8]}}
    - {{op: append_tokens, req: b, tokens: [9]}}
    - {{op: step}}
    - {{op: allocate, req: a, num_new_tokens: 1}}
    - {{op: allocate, req: b, num_new_tokens: 1}}
    - {{op: free, req: a}}
    - {{op: free, req: b}}
    """)
NO_VLLM = AttentionOptions(vllm=False)


@pytest.fixture
def hand_trace(tmp_path):
    path = tmp_path / "hand.yaml"
    path.write_text(HAND)
    return str(path)


@pytest.fixture(scope="module")
def workload_trace(tmp_path_factory):
    """A seeded scheduler workload on a hybrid (full + sliding window) cache:
    chunked prefill, decode, prefix hits and preemption."""
    path = str(tmp_path_factory.mktemp("w") / "workload.jsonl")
    profile = get_profile("0.32")
    cache = CacheConfig(num_blocks=40, groups=(
        GroupConfig(16), GroupConfig(16, "sliding_window", sliding_window=24)))
    spec = WorkloadSpec(seed=1, num_requests=6, block_size=16, user_tokens=(1, 40),
                        max_tokens=(1, 8), token_budget=40, max_running=4,
                        system_prompt_blocks=(1, 3), num_system_prompts=2)
    writer = TraceWriter(path, TraceHeader("0.32.0", "hand", cache,
                                           model=ModelShape(1, 2, 32, "float16")))
    backend = ImplBackend(cache, profile)
    for event, answer in drive(SchedulerWorkload(spec, profile, 20).events(), backend.run):
        writer.write(event, answer)
    writer.close()
    return path


@pytest.mark.vllm
def test_workload_trace_agrees_with_reference_and_vllm(workload_trace):
    o = check_attention(workload_trace)
    assert o.exit_code == 0, "\n".join(o.summary_lines())
    assert o.num_batches > 5 and o.num_tokens > 100
    for name in ("impl~reference", "impl~vllm", "vllm~reference"):
        assert o.stats[name].num_elements > 0 and o.stats[name].ok


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_other_dtypes_against_the_reference(workload_trace, dtype):
    o = check_attention(workload_trace, AttentionOptions(dtype=dtype, vllm=False,
                                                         max_batches=4))
    assert o.exit_code == 0, "\n".join(o.summary_lines())
    assert o.dtype == dtype and o.stats["impl~reference"].num_elements > 0


@pytest.mark.vllm
def test_a_hit_longer_than_the_window_leaves_null_blocks_unread(hand_trace):
    rows = [b.tables[1].row("b") for b in iter_batches(open_trace(hand_trace))
            if any(s.req_id == "b" for s in b.scheduled)]
    assert rows[0][0] == 0, "b's hit should start with the null block"
    o = check_attention(hand_trace)
    assert o.exit_code == 0, "\n".join(o.summary_lines())


def _line_of(text: str) -> int:
    return HAND.splitlines().index(text) + 1


def test_a_wrong_output_is_the_first_divergence_with_its_request(hand_trace, monkeypatch):
    real = impl_call.unified_attention

    def off_by_a_bit(q, k, v, out, cu, *args, **kwargs):
        real(q, k, v, out, cu, *args, **kwargs)
        if int(cu[-1]) == 6:  # the batch of a's decode and b's 5-token prefill
            out[3, 1, 7] += 0.05  # b's token at position 66 (rows: a, b, b, b...)

    monkeypatch.setattr(impl_call, "unified_attention", off_by_a_bit)
    o = check_attention(hand_trace, NO_VLLM)
    d = o.divergence
    assert o.exit_code == 1 and d.check == "impl~reference"
    assert d.step == 2 and d.line == _line_of("- {op: allocate, req: b, num_new_tokens: 5}")
    assert "request 'b' position 66 head 1 dim 7" in d.message


def test_a_block_with_another_prefixs_rows_is_a_divergence(hand_trace, monkeypatch):
    class SwappedBlocks(ImplBackend):
        def block_table(self, req):
            groups = super().block_table(req)
            if req == "b":  # hand b a fresh block instead of its hit's second one
                groups[0][1] = 20
            return groups

    monkeypatch.setattr(steps, "ImplBackend", SwappedBlocks)
    o = check_attention(hand_trace, NO_VLLM)
    assert o.exit_code == 1 and o.divergence.check == "block table"
    assert "request 'b': entry 1 of its block-table row is block 20" in o.divergence.message


def test_a_token_left_unwritten_is_a_divergence(hand_trace, monkeypatch):
    real = impl_call.reshape_and_cache

    def skip_last(k, v, kc, vc, slots, *args):
        slots = slots.clone()
        slots[(slots >= 0).nonzero()[-1]] = -1
        real(k, v, kc, vc, slots, *args)

    monkeypatch.setattr(impl_call, "reshape_and_cache", skip_last)
    o = check_attention(hand_trace, NO_VLLM)
    assert o.exit_code == 1 and o.divergence.check == "cache write"
    assert o.divergence.step == 0


def _write_sidecar(trace_path, sidecar_path, tamper=False):
    """Record every batch's rows (seeded, as the engine would compute them)
    and an output (the float64 reference, rounded) into a sidecar."""
    from safetensors.torch import save_file

    from harness.attention.reference import MirrorCache, reference_attention
    from impl.attention_batch import build_attention_batch

    tensors, meta = {}, {"num_heads": "4"}
    mirror = MirrorCache(24, 16, 2, 32)
    for batch in iter_batches(open_trace(trace_path)):
        attn = build_attention_batch(batch.scheduled, batch.tables[0])
        rows = {}
        for stream, heads, name in ((STREAM_QUERY, 4, "query"), (STREAM_KEY, 2, "key"),
                                    (STREAM_VALUE, 2, "value")):
            rows[name] = torch.cat([seeded_rows(batch.hashes(s.req_id, s.positions), stream,
                                                heads, 32, torch.float16)
                                    for s in batch.scheduled])
        mirror.write(rows["key"], rows["value"], attn.slot_mapping)
        out = reference_attention(rows["query"], mirror, attn, 32 ** -0.5).to(torch.float16)
        if tamper and batch.step == 3:
            out[1, 2, 3] += 0.1
        n = batch.step
        tensors.update({f"step.{n}.{k}": v for k, v in rows.items()})
        tensors[f"step.{n}.output"] = out
        tensors[f"step.{n}.query_start_loc"] = attn.query_start_loc
        meta[f"step.{n}.req_ids"] = json.dumps([s.req_id for s in batch.scheduled])
    save_file(tensors, sidecar_path, metadata=meta)


@pytest.mark.parametrize("tamper", [False, True])
def test_recorded_tensors_are_replayed_and_their_output_checked(tmp_path, tamper):
    # One full-attention group: the recorded output is of that layer.
    hand = HAND.replace("  model:", "  tensors: recorded.safetensors\n  model:").replace(
        ", {block_size: 16, kind: sliding_window, sliding_window: 24}", "")
    trace = tmp_path / "hand.yaml"
    trace.write_text(hand)
    _write_sidecar(str(trace), str(tmp_path / "recorded.safetensors"), tamper)
    o = check_attention(str(trace), NO_VLLM)
    assert o.recorded_batches == o.num_batches == 4
    if not tamper:
        assert o.exit_code == 0, "\n".join(o.summary_lines())
        query_tokens = 40 + 24 + (1 + 5) + (1 + 1)
        assert o.stats["impl~recorded"].num_elements == query_tokens * 4 * 32
    else:
        assert o.exit_code == 1 and o.divergence.check == "impl~recorded"
        assert "request 'b' position 69 head 2 dim 3" in o.divergence.message


def test_bad_inputs_are_exit_code_2(tmp_path, hand_trace):
    no_model = tmp_path / "no-model.yaml"
    no_model.write_text("\n".join(l for l in HAND.splitlines() if "model:" not in l))
    o = check_attention(str(no_model))
    assert o.exit_code == 2 and "model" in o.error
    missing = tmp_path / "missing.yaml"
    missing.write_text(HAND.replace("  model:", "  tensors: nowhere.safetensors\n  model:"))
    o = check_attention(str(missing), NO_VLLM)
    assert o.exit_code == 2 and "nowhere.safetensors" in o.error


@pytest.mark.vllm
def test_a_shape_vllms_cpu_kernels_refuse_is_checked_against_the_reference(tmp_path):
    trace = tmp_path / "head16.yaml"
    trace.write_text(HAND.replace("head_size: 32", "head_size: 16"))
    o = check_attention(str(trace))
    assert o.exit_code == 0, "\n".join(o.summary_lines())
    assert "not 16; compared with the reference only" in o.vllm_groups[0]
    assert any("vLLM not compared" in line for line in o.summary_lines())
    assert "impl~vllm" not in o.stats and o.stats["impl~reference"].ok


def test_outcome_as_json_and_which_traces_want_attention(tmp_path, hand_trace):
    assert wants_attention(hand_trace)
    plain = tmp_path / "plain.yaml"
    plain.write_text("\n".join(l for l in HAND.splitlines() if "model:" not in l))
    assert not wants_attention(str(plain)) and not wants_attention(str(tmp_path / "none"))
    d = check_attention(hand_trace, AttentionOptions(vllm=False, max_batches=1)).as_dict()
    json.dumps(d)
    assert d["exit_code"] == 0 and d["batches"] == 1 and "impl~reference" in d["stats"]
    assert d["notes"] == ["stopped at max_batches=1"]


# -- every paged-attention group kind, compared with vLLM's ops where it has them --

@pytest.mark.vllm
@pytest.mark.parametrize("group", [
    GroupConfig(32, "chunked_local_attention", attention_chunk_size=32),
    GroupConfig(16, "mla_attention"),
    GroupConfig(16, "sliding_window", sliding_window=20),
], ids=["chunked_local", "mla", "sliding_window"])
def test_group_kinds_against_the_reference_and_vllm(group, tmp_path):
    from .seeded_traces import write_kind_trace

    trace = write_kind_trace(str(tmp_path / "kind.jsonl"), group)
    o = check_attention(trace)
    assert o.exit_code == 0, "\n".join(o.summary_lines())
    assert o.vllm_groups == {0: "compared"}
    assert o.stats["impl~reference"].num_elements > 0 and o.stats["impl~vllm"].num_elements > 0
    if group.kind == "mla_attention":  # vLLM's CPU MLA op takes decode batches only
        assert any("decode batches only" in n for n in o.notes)


@pytest.mark.vllm
def test_static_sinks_in_the_blocks_017_reserves(tmp_path):
    from .seeded_traces import write_kind_trace

    trace = write_kind_trace(str(tmp_path / "sink.jsonl"),
                             GroupConfig(16, "sink_full_attention", sink_len=32), "0.17.1")
    o = check_attention(trace)
    assert o.exit_code == 0, "\n".join(o.summary_lines())
    assert o.vllm_groups == {0: "compared"}


def test_static_sink_blocks_handed_to_a_request_are_a_divergence(tmp_path):
    """vLLM 0.32's manager no longer sets the sink blocks aside (0.17 did),
    while its static-sink layers still read the sinks from blocks 1..n: a
    request's tokens land on the sinks, and the ledger says so."""
    from .seeded_traces import write_kind_trace

    trace = write_kind_trace(str(tmp_path / "sink.jsonl"),
                             GroupConfig(16, "sink_full_attention", sink_len=32), "0.32.0")
    o = check_attention(trace, NO_VLLM)
    assert o.exit_code == 1 and o.divergence.check == "block content"
    assert "block 1 offset 0" in o.divergence.message


def test_a_slot_mapping_off_the_traces_blocks_is_a_divergence(hand_trace, monkeypatch):
    from impl.block_table import BlockTable

    real = BlockTable.slot_mapping

    def shifted(self, req_ids, positions, num_padding=0, device="cpu"):
        slots = real(self, req_ids, positions, num_padding, device)
        return torch.where(slots >= 0, slots + self.block_size, slots)

    monkeypatch.setattr(BlockTable, "slot_mapping", shifted)
    o = check_attention(hand_trace, NO_VLLM)
    assert o.exit_code == 1 and o.divergence.check == "slot mapping"
    assert "the trace's blocks put it at slot" in o.divergence.message


def test_a_failing_vllm_op_is_an_environment_result(hand_trace, monkeypatch):
    """Not a silent 'vLLM comparison off': exit code 3 with the reason."""
    from vllm import _custom_ops

    def broken(*args, **kwargs):
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr(_custom_ops, "cpu_attn_reshape_and_cache", broken)
    o = check_attention(hand_trace)
    assert o.exit_code == 3 and "simulated kernel failure" in o.error
    assert o.failure_message() == o.error


def test_an_fp8_run_on_a_cpu_without_avx512_is_exit_3(hand_trace, monkeypatch):
    """The differential of an fp8 cache where vLLM's CPU attention cannot
    keep one (no AVX-512, no AMX: hidden from vLLM's ISA pick) is an
    environment result naming what is missing, not a reference-only pass."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    # (Blocks of 32: vLLM keeps no fp8 cache in 16-token blocks on any CPU.)
    path = Path(hand_trace)
    path.write_text(path.read_text().replace("block_size: 16", "block_size: 32"))
    o = check_attention(hand_trace, AttentionOptions(kv_cache_dtype="fp8"))
    assert o.exit_code == 3, o.error
    assert o.machine_lacks and "AVX-512" in o.machine_lacks
    assert "AVX-512" in o.error and hand_trace in o.error


@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/passwd", "link.safetensors"])
def test_a_sidecar_outside_the_trace_folder_is_refused_unread(tmp_path, name):
    """A gate fed captured traces opens nothing outside a trace's folder on
    the trace's say-so (a symlink out counts as outside)."""
    folder = tmp_path / "traces"
    folder.mkdir()
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(b"not read")
    (folder / "link.safetensors").symlink_to(outside)
    trace = folder / "t.yaml"
    trace.write_text(HAND.replace("  model:", f"  tensors: {name}\n  model:"))
    o = check_attention(str(trace), NO_VLLM)
    assert o.exit_code == 2
    assert o.error == (f"{trace}:1: tensors: '{name}' is outside the trace's folder; "
                       "a sidecar lies beside its trace")


def test_a_sidecar_that_is_not_safetensors_is_bad_input(tmp_path, capsys):
    """`kvconform diff` on a trace whose sidecar is no safetensors file: one
    line naming the trace, line 1 and the field, exit 2 (not a traceback and
    not the divergence code)."""
    from harness.cli.main import main

    (tmp_path / "t.safetensors").write_bytes(b"\x00" * 64)
    trace = tmp_path / "t.yaml"
    trace.write_text(HAND.replace("  model:", "  tensors: t.safetensors\n  model:"))
    assert main(["diff", str(trace)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "tensors" in line]
    assert len(lines) == 1 and lines[0].startswith(f"{trace}:1: tensors: ")
    assert "not a safetensors file" in lines[0]
