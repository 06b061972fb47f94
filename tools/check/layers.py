"""The package's floors, written once, and the check that every import runs down them.

`ggpo_batch` is built in floors: a module imports only its own package or a package on a lower
floor, never a sibling on its own floor and never one above. The rule holds at every level: at the
top (`FLOORS[""]`), inside `train/` (`FLOORS["train"]`), and, for packages without a written order,
as "no circle between their parts". Every import counts: module level, inside functions, and under
`if TYPE_CHECKING:` (a type-only import still ties two files together for a reader and a checker).

Usage: python tools/check/layers.py [PACKAGE_DIR]
  exit 0 and "0 upward imports, 0 circles", or exit 1 and each upward import and circle found.
tests/test_layers.py runs it on the package and on planted defects.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "ggpo_batch"

# Lowest floor first. A name is a subpackage or a module (without `.py`) of the package on the left.
# Parts of a package not named in its floors may import nothing named there that sits above them:
# every part must be placed, so an unplaced part is reported too.
FLOORS: dict[str, list[set[str]]] = {
    "": [
        {"errors"},
        {"common"},
        {"contracts"},
        {"config"},
        {"ledger", "train"},
        {"executor", "reporting", "nightly"},
        {"spec", "notify"},
        {"control"},
        {"dashboard"},
        {"cli"},
        {"smoke", "worker", "__main__"},
    ],
    "train": [
        {"pretrained", "ggpo_config", "task_config"},
        {"config"},
        {"task", "versions"},
        {"rollout"},
        {"audit"},
        {"policy"},
        {"run"},
        {"job", "eval_job"},
    ],
}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int


@dataclass(frozen=True)
class Finding:
    kind: str  # "upward", "same floor", "unplaced" or "circle"
    text: str


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str, known: set[str]) -> Iterable[Edge]:
    """Every import of a known module in `path`, wherever it sits (TYPE_CHECKING included)."""
    is_package = path.name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                head = base[: len(base) - node.level + 1]
                module = ".".join(head + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import sub` imports the module pkg.sub; `from pkg import name` imports pkg.
            subs = [f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in known]
            targets = subs if len(subs) == len(node.names) else [module, *subs]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        for target in targets:
            if target in known and target != name:
                yield Edge(name, target, node.lineno)


def graph(package_dir: Path) -> tuple[set[str], list[Edge]]:
    root = package_dir.parent
    files = {module_name(p, root): p for p in sorted(package_dir.rglob("*.py"))}
    known = set(files)
    edges = [e for m, p in files.items() for e in _imports(p, m, known)]
    return known, edges


def _box(module: str, package: str) -> str | None:
    """The part of `package` that `module` lies in (None when outside it or the package itself)."""
    prefix = f"{package}." if package else ""
    if not module.startswith(prefix) or module == package:
        return None
    return module[len(prefix):].split(".")[0]


def _floor(floors: list[set[str]], box: str) -> int | None:
    return next((i for i, names in enumerate(floors) if box in names), None)


def _circles(nodes: set[str], arrows: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected parts of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(arrows.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def check(package_dir: Path, floors: dict[str, list[set[str]]] | None = None) -> list[Finding]:
    floors = FLOORS if floors is None else floors
    top = package_dir.name
    known, edges = graph(package_dir)
    findings: list[Finding] = []
    packages = {m for m in known if (package_dir.parent / m.replace(".", "/") / "__init__.py").exists()}
    for package in sorted(packages):
        relative = package[len(top) + 1:] if package != top else ""
        # Arrows between the parts of this package (a part imports another part of the same parent).
        arrows: dict[str, set[str]] = {}
        where: dict[tuple[str, str], Edge] = {}
        for e in edges:
            a, b = _box(e.source, package), _box(e.target, package)
            if a is None or b is None or a == b:
                continue
            arrows.setdefault(a, set()).add(b)
            where.setdefault((a, b), e)
        order = floors.get(relative)
        parts = {_box(m, package) for m in known} - {None}
        if order is not None:
            for part in sorted(p for p in parts if p is not None and _floor(order, p) is None):
                findings.append(Finding("unplaced", f"{package}.{part}: not placed on a floor of {package or top}"))
            for (a, b), e in sorted(where.items()):
                fa, fb = _floor(order, a), _floor(order, b)
                if fa is None or fb is None:
                    continue
                if fa < fb:
                    findings.append(Finding("upward", f"{e.source} imports {e.target} (line {e.line}): "
                                                      f"{a} (floor {fa}) is below {b} (floor {fb})"))
                elif fa == fb:
                    findings.append(Finding("same floor", f"{e.source} imports {e.target} (line {e.line}): "
                                                          f"{a} and {b} share floor {fa}"))
        for circle in _circles({p for p in parts if p is not None}, arrows):
            findings.append(Finding("circle", f"in {package}: " + " <-> ".join(circle)))
    # Module level: the import graph of files has no circle anywhere.
    module_arrows: dict[str, set[str]] = {}
    for e in edges:
        module_arrows.setdefault(e.source, set()).add(e.target)
    for circle in _circles(known, module_arrows):
        findings.append(Finding("circle", "modules: " + " <-> ".join(circle)))
    return findings


def main(argv: list[str]) -> int:
    package_dir = Path(argv[1]).resolve() if len(argv) > 1 else ROOT / PACKAGE
    findings = check(package_dir)
    for f in findings:
        print(f"{f.kind}: {f.text}")
    upward = sum(f.kind in ("upward", "same floor") for f in findings)
    circles = sum(f.kind == "circle" for f in findings)
    unplaced = sum(f.kind == "unplaced" for f in findings)
    print(f"{upward} upward imports, {circles} circles" + (f", {unplaced} unplaced" if unplaced else ""))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
