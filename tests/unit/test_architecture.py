"""The package's layering: every module imports, and no module imports from a layer above its own.

The order is the pipeline's: the shared core, storage at the bottom (everything else reads or
writes through it), then the stages a conversation passes through, then the operations and the
gateway surface, and last the applications (CLI, integrations, demo). ``docs/architecture.md``
draws the same picture. Imports inside functions count too: deferring an import does not make an
upward dependency acceptable.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import memstore

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "core",
        (
            "memstore.errors",
            "memstore.document",
            "memstore.record",
            "memstore.scope",
            "memstore.config",
            "memstore.config_sessions",
            "memstore.config_replicas",
            "memstore.config_agent_docs",
            "memstore.session",
            "memstore.agent_doc",
            "memstore.retention",
            "memstore.metrics",
            "memstore.async_face",
        ),
    ),
    ("embedding", ("memstore.embedding",)),
    ("storage", ("memstore.storage",)),
    ("capture", ("memstore.capture",)),
    ("inject", ("memstore.inject",)),
    ("update", ("memstore.update",)),
    ("queue", ("memstore.queue",)),
    ("ops", ("memstore.ops", "memstore.queries")),
    ("gateway", ("memstore.gateway", "memstore.aio")),
    ("apps", ("memstore.integrations", "memstore.console", "memstore.cli", "memstore.demo", "memstore")),
]
MAX_MODULE_LINES = 450
PACKAGE_DIR = Path(memstore.__file__).parent


def _all_modules() -> list[str]:
    names = ["memstore"]
    for info in pkgutil.walk_packages([str(PACKAGE_DIR)], prefix="memstore."):
        names.append(info.name)
    return sorted(names)


def _layer_of(module: str) -> int:
    """The index of the most specific layer prefix that owns ``module``."""
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            owns = module == prefix or module.startswith(prefix + ".")
            if owns and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[0]


def _source_of(module: str) -> Path:
    relative = Path(*module.split(".")[1:])
    package = PACKAGE_DIR / relative / "__init__.py"
    return package if package.exists() else (PACKAGE_DIR / relative).with_suffix(".py")


def _imported_modules(module: str) -> set[str]:
    """Every ``memstore`` module that ``module``'s source imports, at any depth of its code."""
    tree = ast.parse(_source_of(module).read_text(encoding="utf-8"))
    package = module if _source_of(module).name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            # ``from memstore.storage import sql`` imports the submodule memstore.storage.sql.
            found.update(f"{target}.{alias.name}" for alias in node.names)
    known = set(_all_modules())
    return {name for name in found if name in known}


@pytest.mark.parametrize("module", _all_modules())
def test_every_module_imports(module: str) -> None:
    importlib.import_module(module)


@pytest.mark.parametrize("module", _all_modules())
def test_no_module_imports_from_a_higher_layer(module: str) -> None:
    own = _layer_of(module)
    upward = sorted(
        f"{target} ({LAYERS[_layer_of(target)][0]})"
        for target in _imported_modules(module)
        if _layer_of(target) > own
    )
    assert not upward, f"{module} ({LAYERS[own][0]}) imports from higher layers: {upward}"


@pytest.mark.parametrize("module", _all_modules())
def test_modules_stay_small(module: str) -> None:
    lines = len(_source_of(module).read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{module} has {lines} lines; split it by job"


def test_the_layer_check_catches_an_upward_import() -> None:
    # The check itself must be able to fail: storage importing the queue would be upward.
    assert _layer_of("memstore.queue.debounced") > _layer_of("memstore.storage.sql.documents.provider")
    assert "memstore.storage.base" in _imported_modules("memstore.storage.loader")
    assert "memstore.update.updater" in _imported_modules("memstore.queue.debounced")
    assert "memstore.storage.sql.documents.provider" in _imported_modules(
        "memstore.storage.sql"
    )  # a package import
    assert "memstore.cli.output" in _imported_modules("memstore.cli")  # an import inside a function


def test_the_package_exports_the_sql_provider() -> None:
    from memstore import SqlMemoryStorage
    from memstore.storage.sql import SqlMemoryStorage as Documented

    assert SqlMemoryStorage is Documented
