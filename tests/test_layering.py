"""The strict stack, enforced.

Reads every module's imports (with ast, so nothing is executed) and each package's
declared dependencies, and fails on:
- an import of a higher layer or of a sibling (the two codegens never see each other);
- an import of an ember layer the package does not declare, directly or below;
- `torch._inductor` anywhere in product code (benchmarks may use it as a comparator);
- an `ember/__init__.py` or `ember/codegen/__init__.py` (ember is a PEP 420 namespace).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"

# folder -> (distribution, import name). The order is the stack, bottom first.
LAYERS = {
    "graphpasses": ("ember-graphpasses", "ember.graphpasses"),
    "ir": ("ember-ir", "ember.ir"),
    "scheduler": ("ember-scheduler", "ember.scheduler"),
    "codegen-triton": ("ember-codegen-triton", "ember.codegen.triton"),
    "codegen-cpp": ("ember-codegen-cpp", "ember.codegen.cpp"),
    "runtime": ("ember-runtime", "ember.runtime"),
}
# What each layer may depend on, per ARCHITECTURE.md.
ALLOWED = {
    "ember-graphpasses": set(),
    "ember-ir": {"ember-graphpasses"},
    "ember-scheduler": {"ember-ir"},
    "ember-codegen-triton": {"ember-scheduler"},
    "ember-codegen-cpp": {"ember-scheduler"},
    "ember-runtime": {"ember-codegen-triton", "ember-codegen-cpp"},
}
MODULE_TO_DIST = {module: dist for dist, module in LAYERS.values()}


def declared_deps(folder: str) -> set[str]:
    data = tomllib.loads((PACKAGES / folder / "pyproject.toml").read_text())
    names = set()
    for spec in data["project"]["dependencies"]:
        name = spec.split(";")[0].strip()
        for sep in "<>=!~[ ":
            name = name.split(sep)[0]
        names.add(name)
    return {n for n in names if n.startswith("ember-")}


def closure(dist: str, deps: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    todo = list(deps[dist])
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo.extend(deps.get(d, ()))
    return seen


def imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def ember_layer_of(module: str) -> str | None:
    for name in sorted(MODULE_TO_DIST, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return MODULE_TO_DIST[name]
    return None


def python_files(folder: str) -> list[Path]:
    return sorted((PACKAGES / folder).rglob("*.py"))


def test_every_layer_folder_exists_and_nothing_else() -> None:
    assert sorted(p.name for p in PACKAGES.iterdir() if p.is_dir()) == sorted(LAYERS)


@pytest.mark.parametrize("folder", list(LAYERS))
def test_declared_dependencies_match_the_architecture(folder: str) -> None:
    dist, _ = LAYERS[folder]
    assert declared_deps(folder) == ALLOWED[dist]


@pytest.mark.parametrize("folder", list(LAYERS))
def test_imports_stay_within_declared_layers(folder: str) -> None:
    dist, _ = LAYERS[folder]
    deps = {d: declared_deps(f) for f, (d, _) in LAYERS.items()}
    allowed = closure(dist, deps) | {dist}
    problems = []
    for path in python_files(folder):
        for line, module in imported_modules(path):
            layer = ember_layer_of(module)
            where = f"{path.relative_to(ROOT)}:{line}"
            if module.startswith("torch._inductor"):
                problems.append(f"{where} imports {module} (only benchmarks may)")
            if layer is not None and layer not in allowed:
                problems.append(f"{where} imports {module} from {layer}, not a declared layer")
            elif module.startswith("ember.") and layer is None and module != "ember.codegen":
                problems.append(f"{where} imports unknown ember module {module}")
    assert not problems, "\n".join(problems)


def test_ember_is_a_namespace_package() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in PACKAGES.rglob("__init__.py")
        if p.parent.name == "ember"
        or (p.parent.name == "codegen" and p.parent.parent.name == "ember")
    ]
    assert offenders == []


def test_the_checker_catches_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from ember.runtime import compile_graph\nimport torch._inductor.config\n")
    modules = [m for _, m in imported_modules(bad)]
    assert ember_layer_of(modules[0]) == "ember-runtime"
    assert "ember-runtime" not in closure(
        "ember-ir", {d: declared_deps(f) for f, (d, _) in LAYERS.items()}
    )
    assert any(m.startswith("torch._inductor") for m in modules)
