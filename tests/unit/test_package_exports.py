"""``memstore``'s public names load on first use (PEP 562), and every one of them still resolves.

The package lists each name twice: in a ``TYPE_CHECKING`` block for type checkers and IDEs, and in
the ``_EXPORTS`` table its ``__getattr__`` imports from. These tests hold the two lists and
``__all__`` together, so a name added to one and not the others fails here, not in a user's import.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

import pytest

import memstore


def _type_checking_imports() -> dict[str, tuple[str, str]]:
    """``{public name: (module, name there)}`` as the ``if TYPE_CHECKING:`` block imports them."""
    tree = ast.parse(Path(memstore.__file__).read_text(encoding="utf-8"))
    [block] = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    ]
    found: dict[str, tuple[str, str]] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module is not None
        for alias in node.names:
            found[alias.asname or alias.name] = (node.module, alias.name)
    return found


def test_all_the_type_checking_block_and_the_lazy_table_name_the_same_objects() -> None:
    exports: dict[str, str] = memstore._EXPORTS
    renamed: dict[str, str] = memstore._RENAMED
    assert len(memstore.__all__) == len(set(memstore.__all__))
    assert set(memstore.__all__) == set(exports)
    assert set(renamed) <= set(exports)
    table = {name: (module, renamed.get(name, name)) for name, module in exports.items()}
    assert table == _type_checking_imports()


@pytest.mark.parametrize("name", memstore.__all__)
def test_every_public_name_resolves_to_its_defining_object(name: str) -> None:
    module, attribute = _type_checking_imports()[name]
    value: Any = getattr(memstore, name)
    assert value is getattr(importlib.import_module(module), attribute)
    assert name in dir(memstore)


def test_from_memstore_import_star_and_an_unknown_name() -> None:
    namespace: dict[str, Any] = {}
    exec("from memstore import *", namespace)
    assert set(memstore.__all__) <= set(namespace)
    with pytest.raises(AttributeError, match="no_such_name"):
        memstore.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(ImportError):
        exec("from memstore import no_such_name", {})
