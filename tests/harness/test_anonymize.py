"""Anonymisation: a keyed bijection that keeps prefix sharing; the anonymised
trace replays with the same block ids and hits."""

import json
import os
from itertools import combinations
from pathlib import Path

import pytest

from harness.capture.anonymize import Anonymizer, _Feistel
from harness.cli.main import main as kvconform
from harness.report.text import format_failure
from harness.sources.replay import check_trace

GOLDEN = Path(__file__).resolve().parents[2] / "traces" / "golden"


def _lines(path):
    return [json.loads(x) for x in open(path).read().splitlines()[1:]]


def _common(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_each_position_is_a_permutation_of_the_vocabulary():
    prp = _Feistel(1000)
    for keys in (bytes(32), bytes(range(32))):
        assert sorted(prp.permute(keys, t) for t in range(1000)) == list(range(1000))


def test_prefix_sharing_is_kept_exactly_and_tokens_are_hidden():
    anon = Anonymizer(b"k", 1000)
    seqs = [[1, 2, 3, 4, 5], [1, 2, 3, 9, 9], [1, 2, 3, 4, 5, 6], [7, 2, 3], [1, 2, 3, 4, 5]]
    out = [anon.tokens(f"r{i}", s, start=True) for i, s in enumerate(seqs)]
    for (a, x), (b, y) in combinations(zip(seqs, out), 2):
        assert _common(a, b) == _common(x, y)
    assert out[0] != seqs[0]
    # The same token maps differently in different contexts.
    assert anon.tokens("q", [5, 5, 5, 5], True) != [anon.tokens("q", [5], True)[0]] * 4
    # Appended tokens continue the request's own sequence.
    head = anon.tokens("c", [1, 2, 3], True)
    assert head + anon.tokens("c", [4, 5], False) == out[0]
    assert Anonymizer(b"other", 1000).tokens("r", seqs[0], True) != out[0]


@pytest.mark.parametrize("name", ["v0.32/multi-turn-chat.jsonl", "v0.32/lora-and-salts.jsonl",
                                  "v0.32/tight-memory-preemption.jsonl",
                                  "v0.17/prefix-cache-reset.jsonl"])
def test_anonymised_trace_replays_with_the_same_block_ids_and_hits(tmp_path, name, monkeypatch):
    src = GOLDEN / name
    out = tmp_path / "anon.jsonl"
    monkeypatch.setenv("KVCONFORM_ANON_KEY", "a secret")
    assert kvconform(["anonymize", str(src), "--out", str(out)]) == 0
    o = check_trace(str(out), ["impl"])
    assert o.exit_code == 0, o.divergence and format_failure(o.divergence)
    before, after = _lines(src), _lines(out)
    assert [x["op"] for x in before] == [x["op"] for x in after]
    checked = 0
    for x, y in zip(before, after):
        if x["op"] in ("lookup", "allocate", "reset_prefix_cache"):
            assert x["answer"] == y["answer"]  # block ids, hits, refusals: kept, replayed
            checked += 1
        if x["op"] == "checkpoint" and "free_queue" in x["answer"]:
            assert y.get("answer", y.get("expect"))["free_queue"] == x["answer"]["free_queue"]
        if x["op"] == "add_request":
            assert y["prompt"] != x["prompt"] and len(y["prompt"]) == len(x["prompt"])
            assert "answer" not in y  # block hashes depend on the tokens
            for key in ("cache_salt", "lora"):
                assert (key in x) == (key in y) and (key not in x or x[key] != y[key])
    assert checked > 100
    text = out.read_text()
    assert all(x["req"] not in text for x in before[:50] if "req" in x and len(x["req"]) > 3)


def test_anonymize_needs_a_key(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KVCONFORM_ANON_KEY", raising=False)
    src = GOLDEN / "v0.32" / "few-shot.jsonl"
    assert kvconform(["anonymize", str(src), "--out", str(tmp_path / "a.jsonl")]) == 2
    assert "needs a key" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "a.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    monkeypatch.setenv("KVCONFORM_ANON_KEY", "k")
    assert kvconform(["anonymize", str(bad), "--out", str(tmp_path / "a.jsonl")]) == 2
    assert capsys.readouterr().err.startswith(f"{bad}:1: format:")


def test_a_key_on_the_command_line_is_warned_about(tmp_path, capsys):
    """--key shows the secret in `ps` and shell history: it still works (scripts),
    is left out of --help, and says to use KVCONFORM_ANON_KEY."""
    src = GOLDEN / "v0.32" / "few-shot.jsonl"
    assert kvconform(["anonymize", str(src), "--out", str(tmp_path / "a.jsonl"),
                      "--key", "k"]) == 0
    assert "KVCONFORM_ANON_KEY" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kvconform(["anonymize", "--help"])
    assert "--key" not in capsys.readouterr().out


@pytest.mark.vllm
def test_rehash_records_the_dropped_answers_from_vllm(tmp_path, monkeypatch):
    src = GOLDEN / "v0.32" / "few-shot.jsonl"
    out = tmp_path / "anon.jsonl"
    monkeypatch.setenv("KVCONFORM_ANON_KEY", "k")
    assert kvconform(["anonymize", str(src), "--out", str(out), "--rehash"]) == 0
    lines = _lines(out)
    adds = [x for x in lines if x["op"] == "add_request"]
    assert all("answer" in x for x in adds)
    original = {x["answer"]["block_hashes"][0] for x in _lines(src)
                if x["op"] == "add_request" and x["answer"]["block_hashes"]}
    assert original.isdisjoint(x["answer"]["block_hashes"][0] for x in adds
                               if x["answer"]["block_hashes"])
    assert check_trace(str(out), ["vllm", "impl"]).exit_code == 0
