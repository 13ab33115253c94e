"""The package's layout shows its layers: imports point down, never in a cycle."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "cascade"
BASE = {"cascade", "cascade.schema", "cascade.errors", "cascade.settings", "cascade.metrics",
        "cascade.questions", "cascade.calls"}
FORMATS = ("cascade.laya", "cascade.clef")


def _module(path: Path) -> str:
    name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


def _exists(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def import_graph() -> dict[str, set[str]]:
    """Module -> the cascade modules it imports (``from a import b`` counts a.b when b is one)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        module = _module(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cascade"):
                assert node.module is not None
                subs = [f"{node.module}.{a.name}" for a in node.names]
                graph[module] |= {node.module, *filter(_exists, subs)}
            elif isinstance(node, ast.Import):
                graph[module] |= {a.name for a in node.names if a.name.startswith("cascade")}
    return graph


def _layer(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_model_formats_import_only_the_base_and_each_other():
    upward = [
        f"{module} -> {target}"
        for module, targets in import_graph().items() if module.startswith(FORMATS)
        for target in targets if target not in BASE and not target.startswith(FORMATS)
    ]
    assert upward == []


def test_no_import_cycles_between_layers():
    edges: dict[str, set[str]] = defaultdict(set)
    for module, targets in import_graph().items():
        edges[_layer(module)] |= {_layer(t) for t in targets} - {_layer(module), "cascade"}
    cycles, done = [], set()

    def visit(node: str, stack: list[str]) -> None:
        for nxt in sorted(edges[node]):
            if nxt in stack:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, [*stack, nxt])
        done.add(node)

    for node in sorted(edges):
        visit(node, [node])
    assert cycles == []


def test_few_top_level_modules_and_a_docstring_per_package():
    assert len(list(PACKAGE.glob("*.py"))) <= 12
    for init in PACKAGE.glob("*/__init__.py"):
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init} has no docstring"
