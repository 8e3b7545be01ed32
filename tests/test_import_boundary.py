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


# -- the harness's layers (specs/ARCHITECTURE.md, "The harness's packages") ---

def harness_layers() -> dict[str, int]:
    """package -> layer, from the table between the harness-layers markers."""
    text = (ROOT / "specs" / "ARCHITECTURE.md").read_text()
    table = text.split("<!-- harness-layers -->")[1].split("<!-- /harness-layers -->")[0]
    return {m.group(2): int(m.group(1))
            for m in re.finditer(r"^\| (\d+) \| `(\w+)` \|", table, re.M)}


def _harness_imports(module: str, source: str, is_package: bool) -> set[str]:
    """The harness modules a harness module imports, relative imports resolved."""
    out = {m for m in imported_modules(source) if m.startswith("harness.")}
    package = module if is_package else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            parts = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(parts + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in out if m.count(".") >= 1}


def layer_violations(sources: dict[str, tuple[str, bool]], layers: dict[str, int]) -> list[str]:
    """Each import of a module (`harness.PKG...`) into a package of the same or
    a higher layer, other than its own package; `sources`: module -> (source,
    is_package)."""
    found = []
    for module, (source, is_package) in sorted(sources.items()):
        own = module.split(".")[1]
        for target in sorted(_harness_imports(module, source, is_package)):
            other = target.split(".")[1]
            if other != own and layers.get(other, 99) >= layers.get(own, -1):
                found.append(f"{module} (layer {layers.get(own)}) imports {target} "
                             f"(layer {layers.get(other)})")
    return found


def _harness_sources() -> dict[str, tuple[str, bool]]:
    out = {}
    for path in _sources("harness"):
        rel = path.relative_to(ROOT).with_suffix("")
        is_package = rel.name == "__init__"
        parts = rel.parts[:-1] if is_package else rel.parts
        if len(parts) > 1:
            out[".".join(parts)] = (path.read_text(), is_package)
    return out


def test_no_harness_module_reaches_back_up():
    layers = harness_layers()
    assert layers, "specs/ARCHITECTURE.md has no harness-layers table"
    assert layer_violations(_harness_sources(), layers) == []


def test_the_layer_check_catches_an_import_up_or_across():
    layers = {"core": 0, "backends": 1, "trace": 1, "report": 2}
    sources = {
        "harness.core.events": ("def f():\n    from harness.report.text import x\n", False),
        "harness.backends.lockstep": ("from harness.trace import Trace\n", False),
        "harness.report.text": ("from harness.core.events import Event\n"
                                "from . import pages\nfrom ..backends import base\n", False),
    }
    assert layer_violations(sources, layers) == [
        "harness.backends.lockstep (layer 1) imports harness.trace (layer 1)",
        "harness.core.events (layer 0) imports harness.report.text (layer 2)",
    ]
    sources["harness.report.text"] = ("from ..report import pages\nfrom .. import gate\n", False)
    assert layer_violations(sources, layers) == [
        "harness.backends.lockstep (layer 1) imports harness.trace (layer 1)",
        "harness.core.events (layer 0) imports harness.report.text (layer 2)",
        "harness.report.text (layer 2) imports harness.gate (layer None)",
    ]


def test_every_harness_package_is_in_the_layer_table():
    packages = {p.parent.name for p in (ROOT / "harness").glob("*/__init__.py")}
    assert packages == set(harness_layers())
    flat = {p.name for p in (ROOT / "harness").glob("*.py")} - {"__init__.py"}
    assert flat == set(), "harness modules outside a package (ARCHITECTURE.md's layers)"


def test_paths_named_in_architecture_exist():
    text = (ROOT / "specs" / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`((?:harness|impl|specs|ci|tests|traces)/[\w/.\-]+)`", text))
    assert named, "ARCHITECTURE.md names no paths"
    assert sorted(p for p in named if not (ROOT / p.rstrip("/")).exists()) == []


def test_architecture_lists_every_event():
    from harness.core.events import EVENT_TYPES

    text = (ROOT / "specs" / "ARCHITECTURE.md").read_text()
    listed = text.split("<!-- events -->")[1].split("<!-- /events -->")[0]
    assert set(re.findall(r"`(\w+)`", listed)) == {c.__name__ for c in EVENT_TYPES.values()}
