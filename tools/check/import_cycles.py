"""Print import cycles between ggpo_batch modules (module-level and function-level imports alike;
imports under `if TYPE_CHECKING:` do not run and do not count).

Usage: python tools/check/import_cycles.py   -> exit 1 and the cycles, or "no import cycle".
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "ggpo_batch"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    out = set()
    tree = ast.parse(path.read_text())
    # Imports under `if TYPE_CHECKING:` never run: a type-only reference is not a cycle.
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", getattr(block.test, "attr", None)) == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                up = base[: len(base) - node.level + 1]
                mod = ".".join(up + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for t in targets:
            if t in known and t != name:
                out.add(t)
    return out


def main() -> int:
    files = {module_name(p): p for p in PKG.rglob("*.py")}
    known = set(files)
    graph = {m: imports(p, m, known) for m, p in files.items()}
    # A package's __init__ importing its own submodules is not a cycle of concern.
    cycles: set[tuple[str, ...]] = set()

    def visit(node: str, stack: list[str]) -> None:
        for nxt in graph[node]:
            if nxt in stack:
                cyc = stack[stack.index(nxt):]
                if any(not b.startswith(a + ".") and not a.startswith(b + ".") for a, b in zip(cyc, cyc[1:] + cyc[:1])):
                    k = cyc.index(min(cyc))
                    cycles.add(tuple(cyc[k:] + cyc[:k]))
            elif len(stack) < 12:
                visit(nxt, stack + [nxt])

    for m in sorted(graph):
        visit(m, [m])
    for c in sorted(cycles):
        print(" -> ".join(c + (c[0],)))
    if not cycles:
        print("no import cycle")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
