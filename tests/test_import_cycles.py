"""No import cycles among the modules of impl/ and harness/, imports inside
functions counted (issue 20): a cycle hidden in a function-level import
still ties the modules together, it only fails later, at the call.

The finder is this file's own (ast over the sources, nothing imported):
every `import` and `from ... import` anywhere in a module, relative ones
resolved, is an edge to the deepest project module it names; a strongly
connected component of more than one module is a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("impl", "harness")


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> its file (a package by its __init__.py)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _deepest_known(name: str, known) -> str | None:
    """The longest prefix of `name` that is a project module (an imported
    function or class names its module)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _named(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement can load."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        # Relative to the module's package (a package is its own).
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports, at any depth of its code."""
    files = module_files(root, packages)
    graph: dict[str, set[str]] = {name: set() for name in files}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            for name in _named(node, module, is_package):
                target = _deepest_known(name, files)
                if target is not None and target != module:
                    graph[module].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's,
    iterative: a deep import chain must not hit the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_impl_and_harness_have_no_import_cycle():
    cycles = import_cycles(import_graph(ROOT))
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n".join(
        ", ".join(c) for c in cycles)


def test_the_finder_reads_the_real_graph():
    """A finder that parsed nothing would find no cycle too: it must see
    imports at the top, inside functions and relative ones."""
    graph = import_graph(ROOT)
    assert len(graph) > 100
    assert "impl.group_rules" in graph["impl.coordinator"]  # top level, `from x import name`
    assert "impl.managers" in graph["impl.group_rules"]  # a package's __init__
    assert sum(len(edges) for edges in graph.values()) > 300


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_pair_importing_each_other_inside_functions_is_a_cycle(tmp_path):
    """Negative control: the kinds of cycle issue 20 found (one side's
    import inside a function, relative or absolute) are reported."""
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "import pkg.b\n",
        "pkg/b.py": "def late():\n    from pkg.a import thing\n    return thing\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "from . import d\n",
        "pkg/sub/d.py": "def late():\n    from .c import thing\n    return thing\n",
        "pkg/leaf.py": "from pkg import a\n",  # imports into a cycle, is not in one
    })
    cycles = import_cycles(import_graph(tmp_path, ("pkg",)))
    assert sorted(cycles) == [["pkg.a", "pkg.b"], ["pkg.sub.c", "pkg.sub.d"]]


def test_a_chain_without_a_way_back_is_no_cycle(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "from pkg.a import x\n",
        "pkg/a.py": "from pkg.b import x\n",
        "pkg/b.py": "def f():\n    import os\n    return os\nx = 1\n",
    })
    assert import_cycles(import_graph(tmp_path, ("pkg",))) == []
