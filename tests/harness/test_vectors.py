"""The golden vectors (specs/VECTORS.md): impl reproduces every vendored
vector of every followed release, the installed vLLM regenerates its own
release's files byte for byte, and the checker catches a flipped hash byte and
a renamed event field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.core.vllm_releases import RELEASES
from harness.releases import vectors_format as fmt
from harness.releases.vectors import VENDORED
from harness.releases.vectors_check import check_folder
from harness.releases.vectors_diff import diff_folders


def _copy(release: str, tmp_path: Path) -> Path:
    dst = tmp_path / release
    shutil.copytree(VENDORED / release, dst)
    return dst


def _rewrite(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(fmt.dump(doc))


def test_every_followed_release_is_vendored():
    assert sorted(p.name for p in VENDORED.iterdir() if p.is_dir()) == sorted(RELEASES)


@pytest.mark.parametrize("release", RELEASES)
def test_impl_reproduces_every_vector(release):
    result = check_folder(VENDORED / release)
    assert result.mismatches == [], "\n".join(map(str, result.mismatches))
    # Every hash case and event step was run (none skipped silently).
    hashes = fmt.load(VENDORED / release / fmt.HASHES)
    events = fmt.load(VENDORED / release / fmt.EVENTS)
    steps = sum(len(t["steps"]) for t in events["traces"])
    assert result.cases == len(hashes["cases"]) + steps
    assert len(hashes["cases"]) >= 50 and steps >= 12


def test_vendored_files_are_small():
    for release in RELEASES:
        size = sum(p.stat().st_size for p in (VENDORED / release).iterdir())
        assert size < 200_000, f"{release}: {size} bytes"


def test_flipped_hash_byte_is_a_mismatch(tmp_path):
    folder = _copy("0.32.0", tmp_path)

    def flip(doc):
        case = next(c for c in doc["cases"] if c["id"] == "sha256_cbor/seeded/three-blocks")
        h = bytes.fromhex(case["block_hashes"][1])
        case["block_hashes"][1] = (bytes([h[0] ^ 1]) + h[1:]).hex()

    _rewrite(folder / fmt.HASHES, flip)
    mismatches = check_folder(folder).mismatches
    assert len(mismatches) == 1
    m = mismatches[0]
    assert m.field == "block_hashes" and "sha256_cbor/seeded/three-blocks: [1]" in m.message
    line = (folder / fmt.HASHES).read_text().splitlines()[m.line - 1]
    assert '"sha256_cbor/seeded/three-blocks"' in line


def test_renamed_event_field_is_a_mismatch(tmp_path):
    folder = _copy("0.32.0", tmp_path)

    def rename(doc):
        event = doc["traces"][0]["steps"][0]["events"][0]
        event["block_sz"] = event.pop("block_size")

    _rewrite(folder / fmt.EVENTS, rename)
    mismatches = check_folder(folder).mismatches
    assert [m.field for m in mismatches] == ["steps[0].events", "steps[0].events"]
    assert "block_size" in mismatches[0].message  # impl's events
    assert "wire bytes' events" in mismatches[1].message  # the bytes disagree too


def test_renamed_wire_field_is_a_mismatch(tmp_path):
    # A layout whose field names are not vLLM's: the bytes no longer decode
    # (map layout) or no longer name the events' fields.
    folder = _copy("0.32.0", tmp_path)

    def rename(doc):
        for f in doc["wire"]["events"]["BlockStored"]:
            if f["name"] == "medium":
                f["name"] = "tier"

    _rewrite(folder / fmt.EVENTS, rename)
    mismatches = check_folder(folder).mismatches
    assert mismatches and all(m.field.endswith(".wire") for m in mismatches)
    assert "unknown field 'medium'" in mismatches[0].message


def test_diff_names_what_changed_for_a_consumer():
    _, _, changes = diff_folders(VENDORED / "0.32.0", VENDORED / "0.33.0")
    rows = {(c.what, c.after) for c in changes}
    assert ("BlockStored field added", "lookahead_token_ids (#14, optional)") in rows
    assert ("trace lookahead", "runs") in rows
    assert all(not c.what.startswith("NONE_HASH") for c in changes)  # 0.29 changed it
    _, _, older = diff_folders(VENDORED / "0.28.0", VENDORED / "0.29.0")
    assert ("NONE_HASH sha256 unseeded", "hash_fn('vllm-none-hash')") in {
        (c.what, c.after) for c in older}


def test_diff_cli_prints_one_table(capsys):
    assert main(["vectors", "diff", "0.23", "0.24"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["what", "vLLM", "0.23.0", "vLLM", "0.24.0"]
    assert "event layout" in out and "array" in out and "map" in out


def test_check_cli_reports_a_mismatch_as_a_divergence(tmp_path, capsys):
    folder = _copy("0.17.1", tmp_path)
    _rewrite(folder / fmt.HASHES,
             lambda doc: doc["cases"][3]["block_hashes"].reverse() or
             doc["cases"][3]["block_hashes"].append("00"))
    assert main(["vectors", "check", str(folder)]) == 1
    assert f"{folder / fmt.HASHES}:" in capsys.readouterr().out


def test_bad_input_is_one_line(tmp_path, capsys):
    folder = tmp_path / "0.32.0"
    folder.mkdir()
    (folder / fmt.HASHES).write_text("{not json")
    (folder / fmt.EVENTS).write_text("{}")
    assert main(["vectors", "check", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{folder / fmt.HASHES}:1: json:" in err
    assert main(["vectors", "diff", "0.32", "9.99"]) == 2
    assert main(["vectors"]) == 2  # neither --vllm nor --all


@pytest.mark.vllm
def test_installed_vllm_regenerates_its_vendored_files(tmp_path):
    from harness.backends.vllm_backend import installed_vllm_version
    from harness.releases.vectors_produce import produce

    release = installed_vllm_version().split("+")[0]
    produce(tmp_path)
    for name in fmt.FILES:
        fresh = (tmp_path / name).read_bytes()
        assert fresh == (VENDORED / release / name).read_bytes(), (
            f"traces/vectors/{release}/{name} is stale: run make vectors")


def test_installed_release_is_not_an_overlay(monkeypatch):
    # `kvconform --vllm 0.33 vectors` puts the overlay first on sys.path; the
    # release the venv has installed is still the venv's.
    from harness.releases.vectors import ROOT, installed_release

    overlay = ROOT / ".vllm-0.33.0"
    # make test builds it (make overlays): missing, the install is broken.
    assert overlay.exists(), "no 0.33.0 overlay here: run make overlays"
    plain = installed_release()
    monkeypatch.syspath_prepend(str(overlay))
    assert installed_release() == plain != "0.33.0"
