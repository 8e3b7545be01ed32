"""Configs and calls vLLM rejects are bad input before any backend runs (or, for
the ones that need the run's state, at the call): one line naming the field, exit
2, the other traces of the run still checked. Each rule is checked against vLLM
itself: without the rule, vLLM raises on the same trace."""

import json

import pytest

from harness.backends.lockstep import run_event
from harness.cli.main import main
from harness.core.compare import Failure, FailureKind
from harness.core.events import AddRequest
from harness.trace.codec import cache_from_dict, event_from_dict
from impl.profiles import get_profile

FULL = {"num_blocks": 16, "groups": [{"block_size": 4}]}
PROMPT = list(range(40))
ADD = {"op": "add_request", "req": "a", "prompt": PROMPT}
RUN = [ADD, {"op": "lookup", "req": "a"}, {"op": "allocate", "req": "a", "num_new_tokens": 40},
       {"op": "free", "req": "a"}, {**ADD, "req": "b"}, {"op": "lookup", "req": "b"}]

# name: (cache config, events, line of the refusal, field it names)
CASES = {
    "lora-without-path": (FULL, [{**ADD, "lora": {"name": "x", "int_id": 1}}], 2, "lora.path"),
    "prefix-match-unit-3": (
        {"num_blocks": 32, "prefix_match_unit": 3, "groups": [
            {"block_size": 4}, {"block_size": 8, "kind": "sliding_window",
                                "sliding_window": 16}]}, [ADD], 1, "cache.prefix_match_unit"),
    "prefix-match-unit-single-group": (
        {**FULL, "prefix_match_unit": 2}, [ADD], 1, "cache.prefix_match_unit"),
    "chunked-local-mixed-block-sizes": (
        {"num_blocks": 64, "groups": [
            {"block_size": 8}, {"block_size": 4, "kind": "chunked_local_attention",
                                "attention_chunk_size": 16}]}, RUN, 3,
        "cache.groups[1].block_size"),
    "sliding-window-dcp-2": (
        {"num_blocks": 64, "dcp_world_size": 2, "groups": [
            {"block_size": 4, "kind": "sliding_window", "sliding_window": 8}]}, RUN, 3,
        "cache.groups[0].kind"),
    "cross-attention-with-caching": (
        {"num_blocks": 64, "groups": [{"block_size": 4},
                                      {"block_size": 4, "kind": "cross_attention"}]},
        RUN, 3, "cache.groups[1].kind"),
    "sink-len-not-a-block-multiple": (
        {"num_blocks": 32, "groups": [{"block_size": 4, "kind": "sink_full_attention",
                                       "sink_len": 6}]}, [ADD], 1,
        "cache.groups[0].sink_len"),
    "cache-blocks-beyond-the-blocks-held": (
        FULL, [ADD, {"op": "lookup", "req": "a"},
               {"op": "allocate", "req": "a", "num_new_tokens": 4},
               {"op": "cache_blocks", "req": "a", "num_computed_tokens": 12}], 5,
        "num_computed_tokens"),
    "lookup-of-a-running-request": (
        FULL, [ADD, {"op": "lookup", "req": "a"},
               {"op": "allocate", "req": "a", "num_new_tokens": 40},
               {"op": "lookup", "req": "a"}], 5, "req"),
}


def _write(path, cache, events, version="0.32.0"):
    header = {"format": "kvconform-trace/1", "vllm_version": version, "source": "hand",
              "cache": cache}
    path.write_text("\n".join(json.dumps(x) for x in [header, *events]) + "\n")
    return str(path)


@pytest.mark.parametrize("name", CASES)
def test_one_line_naming_the_field_exit_2(name, tmp_path, capsys):
    cache, events, line, field = CASES[name]
    path = _write(tmp_path / f"{name}.jsonl", cache, events)
    assert main(["replay", path]) == 2
    out, err = capsys.readouterr()
    (only,) = err.strip().splitlines()
    assert only.startswith(f"{path}:{line}: {field}: vLLM rejects this: "), only
    assert "Traceback" not in out + err


def test_the_other_traces_of_the_run_are_still_checked(tmp_path, capsys):
    good = _write(tmp_path / "zz-good.jsonl", FULL, RUN)
    bad = [_write(tmp_path / f"{n}.jsonl", c, e) for n, (c, e, _, _) in CASES.items()]
    assert main(["replay", "--json", *bad, good]) == 2
    out, err = capsys.readouterr()
    results = {r["path"]: r for r in json.loads(out)}
    assert results[good]["exit_code"] == 0 and results[good]["verdict"] == "conformant"
    assert all(results[b]["exit_code"] == 2 and results[b]["verdict"] == "bad input"
               for b in bad)
    assert len(err.strip().splitlines()) == len(bad)


_STATE_RULES = ("lookup-of-a-running-request", "cache-blocks-beyond-the-blocks-held")


@pytest.mark.vllm
@pytest.mark.parametrize("name", [n for n in CASES if n not in _STATE_RULES])
def test_vllm_itself_rejects_it(name):
    """The negative control of each rule: the same config and calls, straight
    to vLLM (no reader, no rules): vLLM raises, at building or at the call."""
    from harness.backends.vllm_backend import VllmBackend

    cache, events, line, _ = CASES[name]
    config = cache_from_dict(cache)
    try:
        backend = VllmBackend(config, get_profile("0.32"))
    except Exception:  # noqa: BLE001 - vLLM refuses the config itself
        assert line == 1
        return
    outcome = None
    for ev in events:
        outcome = run_event(event_from_dict(ev), backend, ())
        if isinstance(outcome, Failure):
            break
    assert isinstance(outcome, Failure) and outcome.kind is FailureKind.REJECTED, outcome


@pytest.mark.vllm
def test_without_the_state_rules_vllm_raises_and_impl_answers():
    """The negative control of the rules the backends' bookkeeping applies:
    through the primitives (no rule), vLLM raises where impl answers, which a
    run would report as a divergence."""
    from harness.backends.impl_backend import ImplBackend
    from harness.backends.vllm_backend import VllmBackend

    def run(cls):
        b = cls(cache_from_dict(FULL), get_profile("0.32"))
        for ev in [ADD, {"op": "lookup", "req": "a"},
                   {"op": "allocate", "req": "a", "num_new_tokens": 12},
                   {"op": "cache_blocks", "req": "a", "num_computed_tokens": 12}]:
            b.run(event_from_dict(ev))
        raised = []
        request = b.requests["a"]
        try:  # a lookup of the running request, and the allocation adopting it
            blocks, hit, *_ = b._get_computed_blocks(request)
            b._allocate_slots(request, event_from_dict(
                {"op": "allocate", "req": "a", "num_new_tokens": 4}), blocks, hit)
        except Exception as e:  # noqa: BLE001
            raised.append(type(e).__name__)
        try:  # caching tokens beyond the blocks held
            b.cache_blocks("a", 40)
        except Exception as e:  # noqa: BLE001
            raised.append(type(e).__name__)
        return raised

    assert run(VllmBackend) == ["AssertionError", "IndexError"]
    assert len(run(ImplBackend)) < 2


@pytest.mark.parametrize("name", ["lookup-of-a-running-request",
                                  "cache-blocks-beyond-the-blocks-held"])
def test_state_rules_refuse_alike_on_every_backend(name, make_backend):
    cache, events, _, field = CASES[name]
    backend = make_backend(cache_from_dict(cache))
    outcome = None
    for ev in events:
        outcome = run_event(event_from_dict(ev), backend, ())
        if isinstance(outcome, Failure):
            break
    assert isinstance(outcome, Failure) and outcome.kind is FailureKind.REJECTED
    assert outcome.field == field and outcome.message.startswith("vLLM rejects this: ")


def test_a_skipped_cache_read_is_no_lookup_under_cross_attention(tmp_path):
    """vLLM answers a lookup that skips the prefix cache without searching: the
    rule leaves it alone."""
    cache = CASES["cross-attention-with-caching"][0]
    events = [{**ADD, "skip_reading_prefix_cache": True}, {"op": "lookup", "req": "a"}]
    assert main(["replay", _write(tmp_path / "t.jsonl", cache, events)]) == 0


# -- NONE_HASH ------------------------------------------------------------------------------

XXHASH_UNSEEDED = {**FULL, "hash_algo": "xxhash", "hash_seed": None}


def test_an_unrecorded_random_none_hash_is_not_replayable(tmp_path, capsys):
    path = _write(tmp_path / "t.jsonl", XXHASH_UNSEEDED, [ADD])
    assert main(["replay", path]) == 2
    assert "cache.hash_seed: not replayable: random NONE_HASH" in capsys.readouterr().err
    # sha256 without a seed is vLLM 0.32's fixed default: replayable.
    fixed = _write(tmp_path / "s.jsonl", {**FULL, "hash_seed": None}, [ADD])
    assert main(["replay", fixed]) == 0


@pytest.mark.vllm
def test_record_keeps_the_none_hash_vllm_drew_and_the_copy_replays(tmp_path, capsys):
    src = _write(tmp_path / "in.jsonl", XXHASH_UNSEEDED, RUN)
    out = tmp_path / "out.jsonl"
    assert main(["record", src, "--out", str(out)]) == 0
    header = json.loads(out.read_text().splitlines()[0])
    assert len(header["cache"]["none_hash"]) == 32  # xxhash's 16 bytes
    assert main(["diff", str(out)]) == 0
    # Without it, the same answers cannot be reproduced by anyone.
    del header["cache"]["none_hash"]
    lines = out.read_text().splitlines()
    stripped = _write(tmp_path / "stripped.jsonl", header["cache"],
                      [json.loads(x) for x in lines[1:]])
    assert main(["diff", stripped]) == 2


def test_a_recorded_none_hash_is_what_impl_hashes_with(tmp_path):
    """impl's first block hash follows the recorded NONE_HASH (a negative
    control: another recorded value gives other hashes)."""
    from harness.backends.impl_backend import ImplBackend

    def first_hash(none_hash):
        config = cache_from_dict({**XXHASH_UNSEEDED, "none_hash": none_hash})
        backend = ImplBackend(config, get_profile("0.32"))
        return backend.run(AddRequest("a", tuple(PROMPT)))["block_hashes"][0]

    assert first_hash("00" * 16) == first_hash("00" * 16) != first_hash("01" * 16)
