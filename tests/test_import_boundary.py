"""The import boundary (specs/ARCHITECTURE.md), read from the source with ast:
impl imports neither vllm nor harness; vllm is imported only by the harness
modules that ARCHITECTURE.md lists, and each of them really does."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_IMPORTERS = {("importlib", "import_module"), (None, "__import__"), (None, "import_module")}


def imported_modules(source: str) -> set[str]:
    """Every absolute module a Python source imports: import statements at any
    depth (inside functions too), and importlib.import_module / __import__
    with a literal name."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            f = node.func
            name = (f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                    else None, f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None))
            if name in _IMPORTERS and isinstance(node.args[0].value, str):
                out.add(node.args[0].value)
    return out


def _top(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def _sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def allowed_vllm_importers() -> set[str]:
    """The modules listed under "Who imports vllm" in specs/ARCHITECTURE.md."""
    text = (ROOT / "specs" / "ARCHITECTURE.md").read_text()
    section = text.split("<!-- vllm-importers -->")[1].split("<!-- /vllm-importers -->")[0]
    return set(re.findall(r"`(harness/[\w/]+\.py)`", section))


@pytest.mark.parametrize("source, imports", [
    ("import vllm", {"vllm"}),
    ("from vllm.v1.core import kv_cache_manager", {"vllm.v1.core"}),
    ("def f():\n    import vllm.config as c\n", {"vllm.config"}),
    ("import importlib\nimportlib.import_module('vllm.v1')", {"importlib", "vllm.v1"}),
    ("__import__('harness.cli.main')", {"harness.cli.main"}),
    ("from . import sibling\nfrom .x import y", set()),
    ("x = 'import vllm'", set()),
])
def test_the_reader_sees_every_kind_of_import(source, imports):
    assert imported_modules(source) == imports


def test_impl_imports_neither_vllm_nor_harness():
    offenders = {}
    for path in _sources("impl"):
        bad = _top(imported_modules(path.read_text())) & {"vllm", "harness"}
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert not offenders, offenders


def test_vllm_is_imported_only_by_the_listed_harness_modules():
    allowed = allowed_vllm_importers()
    assert allowed, "specs/ARCHITECTURE.md lists no vllm importers"
    importers = {str(p.relative_to(ROOT)) for p in _sources("harness")
                 if "vllm" in _top(imported_modules(p.read_text()))}
    assert importers - allowed == set(), "vllm imported outside the boundary"
    assert allowed - importers == set(), "listed in ARCHITECTURE.md but imports no vllm"
