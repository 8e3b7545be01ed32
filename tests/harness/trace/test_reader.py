"""Bad input never gives a traceback: each case is a TraceError naming
file:line and the field (exit 2; 3 for a version with no profile)."""

import json

import pytest

from harness.trace import TraceError, open_trace
from impl.profiles import supported_versions

HEADER = {"format": "kvconform-trace/1", "vllm_version": "0.32.0", "source": "hand",
          "cache": {"num_blocks": 8, "groups": [{"block_size": 4}], "max_model_len": 64}}
ADD = {"op": "add_request", "req": "r", "prompt": [1, 2, 3]}


def _head() -> bytes:
    return (json.dumps(HEADER) + "\n").encode()



def write(tmp_path, *lines, raw: bytes | None = None, name="t.jsonl"):
    path = tmp_path / name
    if raw is not None:
        path.write_bytes(raw)
    else:
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def error_of(path) -> TraceError:
    with pytest.raises(TraceError) as e:
        trace = open_trace(path)
        list(trace.records)
    return e.value


CASES = {
    "empty file": (dict(raw=b""), 1, "(file)", "empty"),
    "binary": (dict(raw=b"\x89PNG\r\n\x1a\n\x00\x00"), 1, "(line)", "not UTF-8"),
    "non-utf8 event": (dict(raw=(json.dumps(HEADER) + "\n").encode() + b'{"op": "st\xffep"}\n'),
                       2, "(line)", "not UTF-8"),
    "truncated last line": (dict(raw=(json.dumps(HEADER) + "\n" + json.dumps(ADD) + "\n"
                                      + '{"op": "lookup", "re').encode()),
                            3, "(line)", "truncated"),
    "header missing": ((ADD,), 1, "format", "missing header"),
    "unknown format": (({**HEADER, "format": "kvconform-trace/9"},), 1, "format",
                       "unknown format"),
    "unknown op": ((HEADER, {"op": "teleport", "req": "r"}), 2, "op", "unknown op 'teleport'"),
    "missing field": ((HEADER, {"op": "add_request", "req": "r"}), 2, "(event)", "prompt"),
    "mistyped field": ((HEADER, ADD, {"op": "allocate", "req": "r", "num_new_tokens": "5"}),
                       3, "num_new_tokens", "integer"),
    "negative token": ((HEADER, {**ADD, "prompt": [1, -2]}), 2, "prompt[1]",
                       "bigger than or equal to 0"),
    "unknown field": ((HEADER, {**ADD, "promtp": [1]}), 2, "promtp", "unknown field"),
    "block id out of range": ((HEADER, {"op": "evict_blocks", "block_ids": [1, 8]}), 2,
                              "block_ids[1]", "block id 8 >= num_blocks 8"),
    "answer block id out of range": ((HEADER, ADD, {"op": "lookup", "req": "r", "answer": {
        "hit_tokens": 0, "block_ids": [[9]]}}), 3, "answer.block_ids[0][0]", ">= num_blocks"),
    "absurd pool": (({**HEADER, "cache": {**HEADER["cache"], "num_blocks": 10**12}},), 1,
                    "cache.num_blocks", "maximum"),
    "prompt beyond max_model_len": ((HEADER, {**ADD, "prompt": list(range(65))}), 2, "prompt",
                                    "exceed max_model_len"),
    "unknown request": ((HEADER, {"op": "lookup", "req": "ghost"}), 2, "req", "no request 'ghost'"),
    "freed request": ((HEADER, ADD, {"op": "free", "req": "r"}, {"op": "lookup", "req": "r"}), 4,
                      "req", "already freed"),
    "duplicate request": ((HEADER, ADD, ADD), 3, "req", "already exists"),
    # Pathological JSON (issue 15): input no parser can hold is one line too.
    "deeply nested event": (dict(raw=_head() + b'{"op":"step","answer":' + b"[" * 100_000
                                 + b"]" * 100_000 + b"}\n"), 2, "(line)", "nested too deeply"),
    "deeply nested header": (dict(raw=b'{"format":' + b"[" * 100_000 + b"]" * 100_000
                                  + b"}\n"), 1, "(line)", "nested too deeply"),
    "integer of millions of digits": (dict(raw=_head() + b'{"op":"step","answer":{"n":'
                                           + b"7" * 2_000_000 + b"}}\n"), 2, "(line)",
                                      "an integer too large to read"),
    "header integer of millions of digits": (
        dict(raw=b'{"format":"kvconform-trace/1","cache":{"num_blocks":' + b"9" * 2_000_000
             + b"}}\n"), 1, "(line)", "an integer too large to read"),
    "number beyond float": (dict(raw=_head() + b'{"op":"checkpoint","answer":{"usage":1e999}}\n'),
                            2, "(line)", "a number too large to read"),
    "NaN": (dict(raw=_head() + b'{"op":"checkpoint","answer":{"usage":NaN}}\n'), 2, "(line)",
            "not valid JSON"),
    "lone surrogate": (dict(raw=_head() + b'{"op":"add_request","req":"\\ud800","prompt":[1]}\n'),
                       2, "(line)", "surrogate"),
    "two objects on a line": (dict(raw=_head() + b'{"op":"step"}{"op":"step"}\n'), 2, "(line)",
                              "not valid JSON"),
    "byte order mark": (dict(raw=b"\xef\xbb\xbf" + _head()), 1, "(line)", "BOM"),
    "array for an event": (dict(raw=_head() + b'[{"op":"step"}]\n'), 2, "(event)",
                           "must be a JSON object"),
    "integer as a float": ((HEADER, ADD, {"op": "allocate", "req": "r", "num_new_tokens": 1.5}),
                           3, "num_new_tokens", "integer"),
    "bool for an integer": ((HEADER, ADD, {"op": "allocate", "req": "r", "num_new_tokens": True}),
                            3, "num_new_tokens", "integer"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input(tmp_path, case):
    spec, line, field, words = CASES[case]
    path = write(tmp_path, raw=spec["raw"]) if isinstance(spec, dict) else write(tmp_path, *spec)
    err = error_of(path)
    assert (err.line, err.field) == (line, field), str(err)
    assert words in err.message, str(err)
    assert err.exit_code == 2
    assert str(err).startswith(f"{path}:{line}: {field}: ") and "\n" not in str(err)


def test_version_without_profile_is_exit_3(tmp_path):
    err = error_of(write(tmp_path, {**HEADER, "vllm_version": "0.9.2"}))
    assert (err.line, err.field, err.exit_code) == (1, "vllm_version", 3)
    assert f"supported: {supported_versions()}" in err.message


def test_yaml_errors_name_the_event_line(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(
        "header:\n  format: kvconform-trace/1\n  vllm_version: 0.32.0\n  source: hand\n"
        "  cache: {num_blocks: 8, groups: [{block_size: 4}]}\n"
        "events:\n- {op: add_request, req: r, prompt: [1, 2]}\n"
        "- op: allocate\n  req: r\n  num_new_tokens: -1\n")
    err = error_of(str(path))
    assert (err.line, err.field) == (8, "num_new_tokens")


@pytest.mark.parametrize("doc", [
    "header: " + "[" * 50_000 + "]" * 50_000 + "\nevents: []\n",
    "header:\n  format: kvconform-trace/1\n  cache: {num_blocks: " + "9" * 2_000_000 + "}\n",
], ids=["deep nesting", "integer of millions of digits"])
def test_pathological_yaml_is_one_line(tmp_path, doc):
    path = tmp_path / "t.yaml"
    path.write_text(doc)
    err = error_of(str(path))
    assert err.field == "(yaml)" and err.exit_code == 2 and "\n" not in str(err)


def test_yaml_is_loaded_safely(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("header: !!python/object/apply:os.system ['echo pwned']\nevents: []\n")
    err = error_of(str(path))
    assert err.field == "(yaml)" and err.exit_code == 2


def test_streaming_reads_lazily(tmp_path):
    """A bad line far down is only reached when iterated: the reader streams."""
    path = write(tmp_path, HEADER, ADD, {"op": "lookup", "req": "r"}, {"op": "nope"})
    trace = open_trace(path)
    it = iter(trace.records)
    assert next(it).event.kind == "add_request"
    assert next(it).event.kind == "lookup"
    with pytest.raises(TraceError):
        next(it)


def test_examples_in_the_format_document_replay(tmp_path):
    """specs/TRACE_FORMAT.md's examples are real traces that replay conformant."""
    import re
    from pathlib import Path

    from harness.sources.replay import check_trace

    doc = (Path(__file__).resolve().parents[3] / "specs" / "TRACE_FORMAT.md").read_text()
    blocks = re.findall(r"```(jsonl|yaml)\n(.*?)```", doc, re.S)
    assert {kind for kind, _ in blocks} == {"jsonl", "yaml"}
    for i, (kind, text) in enumerate(blocks):
        if "kvconform-trace/1" not in text or "events:" not in text and kind == "yaml":
            continue
        path = tmp_path / f"example{i}.{kind}"
        path.write_text(text)
        o = check_trace(str(path), ["impl"])
        assert o.exit_code == 0, (kind, o.error, o.divergence)
        assert o.num_events > 3
