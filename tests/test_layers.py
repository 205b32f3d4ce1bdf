"""The packages import one way: no cycles, and every layer only uses the layers below it.

Imports are read from the source (every ``import`` statement, including those inside
functions and ``TYPE_CHECKING`` blocks, so a cycle cannot hide behind a local import), and
every module is also imported alone in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("broker", "overlay", "security", "reconfig", "analytics")

# Each layer and the layers it may import (besides itself). Longest prefix wins.
ALLOWED: dict[str, set[str]] = {
    "security": set(),
    "overlay": {"security"},
    "reconfig": {"overlay", "security"},
    "analytics": {"overlay", "security", "reconfig"},
    "broker.errors": {"security"},
    "broker.language": {"broker.errors", "security"},
    "broker.wire": {"broker.language", "broker.errors", "security"},
    "broker.routing": {"broker.wire", "broker.language", "broker.errors", "security", "overlay"},
    "broker.client": {
        "broker.routing",
        "broker.wire",
        "broker.language",
        "broker.errors",
        "security",
        "overlay",
    },
    "broker.daemon": {
        "broker.routing",
        "broker.wire",
        "broker.language",
        "broker.errors",
        "security",
        "overlay",
        "reconfig",
    },
    "broker.tools": {
        "broker.client",
        "broker.daemon",
        "broker.routing",
        "broker.wire",
        "broker.language",
        "broker.errors",
        "security",
        "overlay",
        "reconfig",
    },
    "broker.__main__": {"broker.tools"},
    "broker": set(),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports, anywhere in its source."""
    found: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for imported in targets:
            target = imported
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer_of(name: str) -> str:
    """The most specific layer ``name`` belongs to."""
    layers = [layer for layer in ALLOWED if name == layer or name.startswith(layer + ".")]
    return max(layers, key=len)


GRAPH = {name: imports_of(name, path, set(all_modules())) for name, path in all_modules().items()}


def test_every_layer_imports_only_the_layers_below_it() -> None:
    wrong = []
    for name, targets in GRAPH.items():
        mine = layer_of(name)
        for target in targets:
            theirs = layer_of(target)
            if theirs != mine and theirs not in ALLOWED[mine] and not _is_parent(target, name):
                wrong.append(f"{name} imports {target} ({mine} may not use {theirs})")
    assert not wrong, "\n".join(sorted(wrong))


def _is_parent(target: str, name: str) -> bool:
    """A package's ``__init__`` (a docstring) counts as part of every module below it."""
    return name.startswith(target + ".")


def test_no_module_imports_itself_back_through_others() -> None:
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH.get(node, ())):
            if _is_parent(nxt, node):
                continue
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(GRAPH):
        if node not in state:
            visit(node)
    assert not cycles, "\n".join(cycles)


def test_the_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from security.errors import TrellisError\n")
    assert imports_of("overlay.mod", source, {"security", "security.errors"}) == {"security.errors"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n in all_modules() if not n.endswith("__main__")))
def test_module_imports_alone(name: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", f"import {name}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
