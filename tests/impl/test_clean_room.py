"""impl/ is written in the project's own words (issue 11, clean room), checked
against the installed vLLM's KV cache source (vllm/v1/core/,
vllm/v1/kv_offload/cpu/ with its base.py, and vllm/v1/kv_cache_interface.py):

- no string literal of 20+ characters (messages, docstrings, f-string parts)
  is one of vLLM's;
- no impl file shares more than 10% of its stripped lines of 30+ characters
  with any single one of those vLLM files.

Public names (classes, methods, attributes) are vLLM's on purpose; what the
two checks measure is everything written around them.
"""

from __future__ import annotations

import ast
import importlib.util
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

IMPL = Path(__file__).resolve().parents[2] / "impl"
MIN_LITERAL = 20
MIN_LINE = 30
MAX_SHARED = 0.10


def vllm_sources() -> list[Path]:
    spec = importlib.util.find_spec("vllm")  # located, not imported
    assert spec is not None and spec.origin, "vLLM is not installed"
    root = Path(spec.origin).parent / "v1"
    files = sorted((root / "core").rglob("*.py")) + [root / "kv_cache_interface.py"]
    # impl/kv_offload/ is written from the offload tier's CPU manager.
    files += sorted((root / "kv_offload" / "cpu").rglob("*.py")) + [root / "kv_offload" / "base.py"]
    assert len(files) > 5 and all(f.is_file() for f in files), files
    return files


def literals(path: Path) -> dict[str, int]:
    """String constants of MIN_LITERAL+ characters -> a line they are on."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if len(node.value) >= MIN_LITERAL:
                found.setdefault(node.value, node.lineno)
    return found


def long_lines(path: Path) -> list[str]:
    return [s for s in (line.strip() for line in path.read_text().splitlines())
            if len(s) >= MIN_LINE]


def copied_literals(impl_root: Path, sources: list[Path]) -> list[str]:
    theirs = set()
    for source in sources:
        theirs |= literals(source).keys()
    return [f"{path.relative_to(impl_root.parent)}:{line}: {text[:60]!r}"
            for path in sorted(impl_root.rglob("*.py"))
            for text, line in literals(path).items() if text in theirs]


def shared_lines(impl_root: Path, sources: list[Path]) -> dict[str, tuple[float, str]]:
    """impl file -> (largest share of its long lines found in one vLLM file, that file)."""
    theirs = {source: set(s.strip() for s in source.read_text().splitlines())
              for source in sources}
    worst = {}
    for path in sorted(impl_root.rglob("*.py")):
        mine = long_lines(path)
        if not mine:
            continue
        share, where = max((sum(line in lines for line in mine) / len(mine), source.name)
                           for source, lines in theirs.items())
        worst[str(path.relative_to(impl_root.parent))] = (share, where)
    return worst


def test_no_string_literal_is_vllms():
    found = copied_literals(IMPL, vllm_sources())
    assert not found, "string literals copied from vLLM:\n" + "\n".join(found)


def test_no_file_shares_more_than_a_tenth_of_its_lines_with_vllm():
    over = {f: (share, where) for f, (share, where) in shared_lines(IMPL, vllm_sources()).items()
            if share > MAX_SHARED}
    assert not over, "\n".join(f"{f}: {share:.0%} of its {MIN_LINE}+-character lines are in "
                               f"vllm/.../{where}" for f, (share, where) in over.items())


def test_the_checks_catch_a_copied_literal_and_copied_lines(tmp_path):
    """Negative control: a copy of impl with one vLLM literal and a run of vLLM
    lines pasted in is flagged by both checks."""
    sources = vllm_sources()
    copy = tmp_path / "impl"
    shutil.copytree(IMPL, copy)
    donor = next(s for s in sources if s.name == "block_pool.py")
    literal = max(literals(donor), key=len)
    lines = [line for line in long_lines(donor)
             if '"""' not in line and "\\" not in line][:40]
    target = copy / "block_pool.py"
    target.write_text(target.read_text() + f"\n\n_PASTED = {literal!r}\n")
    victim = copy / "request.py"
    pasted = "\n".join(lines)
    victim.write_text(victim.read_text() + f'\n_PASTED = """\n{pasted}\n"""\n')
    assert any(f.startswith("impl/block_pool.py:") for f in copied_literals(copy, sources))
    shares = shared_lines(copy, sources)
    assert shares["impl/request.py"][0] > MAX_SHARED
    assert shares["impl/request.py"][0] > shared_lines(IMPL, sources)["impl/request.py"][0]
