"""Pathological inputs to every parser a user feeds (traces in JSON Lines and
YAML, workload presets, fuzz configs, saved KV-event streams, live KV-event
batches): one line on stderr and exit 2, never a traceback, and the other
traces of the run still checked. (The decoder's own limits, deep JSON nesting
and huge integers, are tested with the trace decoder.)"""

import json
import random

import pytest

from harness.capture.kv_event_stream import EventBatch, batch_problem
from harness.capture.kv_event_trace import EventTraceBuilder
from harness.cli.main import main

HEADER = json.dumps({"format": "kvconform-trace/1", "vllm_version": "0.32.0",
                     "source": "hand", "cache": {"num_blocks": 8, "groups": [{"block_size": 4}]}})
YAML_HEAD = ("header:\n  format: kvconform-trace/1\n  vllm_version: '0.32.0'\n  source: hand\n"
             "  cache: {num_blocks: 8, groups: [{block_size: 4}]}\n")
LAUGHS = "".join(f"- &{c} [{','.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefg", "bcdefgh"))

TRACES = {
    "nan.jsonl": HEADER + '\n{"op":"add_request","req":"a","prompt":[NaN]}\n',
    "infinity.jsonl": HEADER.replace('"num_blocks": 8', '"num_blocks": Infinity') + "\n",
    "bool-for-int.jsonl": HEADER + '\n{"op":"add_request","req":"a","prompt":[1,2,3,4,5]}\n'
    '{"op":"lookup","req":"a"}\n{"op":"allocate","req":"a","num_new_tokens":true}\n',
    "byte-order-mark.jsonl": "\ufeff" + HEADER + "\n",
    "header-in-a-list.jsonl": f"[{HEADER}]\n",
    "event-not-an-object.jsonl": HEADER + '\n"step"\n',
    "answer-not-an-object.jsonl": HEADER + '\n{"op":"step","answer":"yes"}\n',
    "bad-none-hash.jsonl": HEADER.replace('"num_blocks": 8', '"num_blocks": 8, "none_hash": "xyz"')
    + "\n",
    "truncated-not-a-string.jsonl": HEADER.replace('"source": "hand"',
                                                   '"source": "hand", "truncated": 5') + "\n",
    "yaml-python-tag.yaml": "!!python/object/apply:os.system ['true']\n",
    "yaml-nested-too-deep.yaml": "header: " + "[" * 3000 + "]" * 3000 + "\n",
    "yaml-billion-laughs.yaml": YAML_HEAD + "events:\n- &a [1,1,1,1,1,1,1,1,1,1]\n" + LAUGHS,
    "yaml-unhashable-key.yaml": YAML_HEAD + "events:\n- {op: step, ? [1, 2] : x}\n",
    "yaml-two-documents.yaml": "header: {}\n---\nevents: []\n",
    "yaml-version-as-number.yaml": YAML_HEAD.replace("'0.32.0'", "0.32") + "events: []\n",
    "yaml-binary.yaml": "header:\n  format: !!binary aGVsbG8=\n",
}


@pytest.mark.parametrize("name", TRACES)
def test_a_pathological_trace_is_one_line_exit_2(name, tmp_path, capsys):
    path = tmp_path / name
    path.write_text(TRACES[name], encoding="utf-8")
    good = tmp_path / "good.jsonl"
    good.write_text(HEADER + '\n{"op":"step"}\n')
    assert main(["replay", str(path), str(good)]) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"{path}:"), err
    assert "Traceback" not in out + err and f"{good}: conformant" in out


PRESETS = {
    "nested-too-deep": "name: " + "[" * 3000 + "]" * 3000 + "\n",
    "python-tag": "!!python/object/apply:os.system ['true']\n",
    "a-list": "- 1\n",
    "billion-laughs": "name: x\nrequests: &a [1,1,1,1,1,1,1,1,1,1]\n"
    + LAUGHS.replace("- &", "x&").replace("x&b", "b: &b").replace("x&", "\n_: &"),
}


@pytest.mark.parametrize("name", PRESETS)
def test_a_pathological_preset_is_one_line_exit_2(name, tmp_path, capsys):
    path = tmp_path / f"{name}.workload"
    path.write_text(PRESETS[name])
    assert main(["capture", "scheduler", "--preset", str(path), "--out",
                 str(tmp_path / "t.jsonl")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"{path}:" in err, err


@pytest.mark.parametrize("text", ["block_sizes: four\n", "block_sizes: []\n",
                                  "p_caching: 7\n", "vocab: -1\n", "weights: {new: x}\n",
                                  "block_sizes: " + "[" * 3000 + "]" * 3000 + "\n"])
def test_a_pathological_fuzz_config_is_one_line_exit_2(text, tmp_path, capsys):
    path = tmp_path / "fuzz.yaml"
    path.write_text(text)
    assert main(["fuzz", "--config", str(path), "--seconds", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(path) in err, err


@pytest.mark.parametrize("line", [
    '{"seq": "x", "ts": 0, "events": []}',
    '{"seq": 0, "ts": 0, "events": [["Teleported"]]}',
    '{"seq": 0, "ts": 0, "events": [{"type": "BlockStored", "block_hashes": [[1]], '
    '"token_ids": [1, 2], "block_size": 2}]}',
    '{"seq": 0, "ts": 0, "events": [{"type": "BlockStored", "block_hashes": [1], '
    '"token_ids": [1, 2], "block_size": 2, "extra_keys": 5}]}',
    "[" * 100000 + "]" * 100000,
])
def test_a_pathological_saved_stream_is_one_line_exit_2(line, tmp_path, capsys):
    path = tmp_path / "s.kvstream"
    path.write_text(line + "\n")
    out = tmp_path / "k.jsonl"
    assert main(["capture", "kv-events", "--from-stream", str(path), "--out", str(out),
                 "--vllm-version", "0.32.0"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"{path}:1:" in err, err
    assert not out.exists()


def test_a_batch_the_validation_passes_never_breaks_the_trace_builder():
    """Junk in every field of a KV event (as a live stream may send it): either
    the batch is refused with a reason, or the builder takes it."""
    junk = [None, 0, -1, 1.5, True, "x", "", [], [1], [[1]], [["a"]], [None], {}, {"a": 1},
            ["a", 2], 10 ** 30, [[{"a": 1}]]]
    fields = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
              "lora_name", "extra_keys", "group_idx", "session_id", "medium"]
    rng = random.Random(0)
    refused = 0
    for n in range(4000):
        ev = {"type": rng.choice(["BlockStored", "BlockRemoved", "AllBlocksCleared"]),
              "block_hashes": [1], "token_ids": [1, 2], "block_size": 2}
        for f in rng.sample(fields, rng.randint(1, 3)):
            ev[f] = rng.choice(junk)
        batch = EventBatch(n, 0.0, [ev], None, "map")
        if batch_problem(batch) is not None:
            refused += 1
            continue
        EventTraceBuilder("0.32.0", lora_paths={"x": "/p"}).add_batch(batch)
    assert 0 < refused < 4000


# Semantic bad input: well-formed traces that say something impossible. Each
# is `kvconform diff` (vLLM and impl) on its own: one line on stderr naming
# file:line and the field, exit 2 (3: the environment's), no traceback, no
# divergence. name -> (header changes, events, line, field, exit code).
_MODEL = {"num_layers": 1, "num_kv_heads": 1, "head_size": 64, "dtype": "float16"}
_PROMPT = [{"op": "add_request", "req": "a", "prompt": list(range(40))}]
_RUN = _PROMPT + [{"op": "lookup", "req": "a"},
                  {"op": "allocate", "req": "a", "num_new_tokens": 40}]
_GROUP = {"block_size": 16}
SEMANTIC = {
    "unknown-op": ({}, [{"op": "teleport", "req": "a"}], 2, "op", 2),
    "free-unknown-request": ({}, [{"op": "free", "req": "ghost"}], 2, "req", 2),
    "allocate-before-add": ({}, [{"op": "allocate", "req": "a", "num_new_tokens": 4}], 2,
                            "req", 2),
    "duplicate-request": ({}, _PROMPT * 2, 3, "req", 2),
    "negative-tokens": ({}, _PROMPT + [{"op": "allocate", "req": "a", "num_new_tokens": -3}],
                        3, "num_new_tokens", 2),
    "expect-a-field-no-answer-has": ({}, _PROMPT + [{"op": "lookup", "req": "a",
                                                     "expect": {"hits": 16}}],
                                     3, "expect.hits", 2),
    "incomplete-lora": ({}, [{"op": "add_request", "req": "a", "prompt": [1, 2],
                             "lora": {"name": "x"}}], 2, "lora", 2),
    "block-size-0": ({"groups": [{"block_size": 0}]}, [], 1, "cache.groups.0.block_size", 2),
    "one-block-pool": ({"num_blocks": 1}, [], 1, "cache.num_blocks", 2),
    "unknown-kind": ({"groups": [{"block_size": 16, "kind": "wormhole"}]}, [], 1,
                     "cache.groups.0.kind", 2),
    "window-without-size": ({"groups": [{"block_size": 16, "kind": "sliding_window"}]}, [], 1,
                            "cache.groups.0", 2),
    "model-head-size-0": ({"model": {**_MODEL, "head_size": 0}}, _RUN, 1, "model.head_size", 2),
    "model-no-kv-heads": ({"model": {**_MODEL, "num_kv_heads": 0}}, _RUN, 1,
                          "model.num_kv_heads", 2),
    "model-no-layers": ({"model": {**_MODEL, "num_layers": 0}}, _RUN, 1, "model.num_layers", 2),
    "unknown-kv-cache-dtype": ({"model": {**_MODEL, "kv_cache_dtype": "fp4"}}, _RUN, 1,
                               "model.kv_cache_dtype", 2),
    "sidecar-missing": ({"model": _MODEL, "tensors": "missing.safetensors"}, _RUN, 1,
                        "tensors", 2),
    "sidecar-a-folder": ({"model": _MODEL, "tensors": "."}, _RUN, 1, "tensors", 2),
    "sidecar-not-safetensors": ({"model": _MODEL, "tensors": "notes.safetensors"}, _RUN, 1,
                                "tensors", 2),
    "sidecar-outside-the-folder": ({"model": _MODEL, "tensors": "../../../../etc/passwd"},
                                   _RUN, 1, "tensors", 2),
    "release-without-profile": ({"vllm_version": "0.9.0"}, [], 1, "vllm_version", 3),
}


def _semantic_trace(tmp_path, name):
    changes, events, _, _, _ = SEMANTIC[name]
    header = json.loads(HEADER)
    header["cache"] = {"num_blocks": 8, "groups": [_GROUP]}
    for key, value in changes.items():
        (header["cache"] if key in ("num_blocks", "groups") else header)[key] = value
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "notes.safetensors").write_text("not a safetensors file")
    path = folder / f"{name}.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in [header, *events]))
    return path


@pytest.mark.vllm
@pytest.mark.parametrize("name", SEMANTIC)
def test_semantic_bad_input_is_one_line_naming_file_line_and_field(name, tmp_path, capsys):
    path = _semantic_trace(tmp_path, name)
    _, _, line, field, code = SEMANTIC[name]
    assert main(["diff", str(path)]) == code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "DIVERGED" not in out
    problem = f"{path}:{line}: {field}:"
    lines = [x for x in (out + err).splitlines() if x.startswith(problem)]
    assert len(lines) == 1, out + err
