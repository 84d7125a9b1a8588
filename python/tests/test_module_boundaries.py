"""No module of the hsstore package imports another's private names (``_x``): what two modules
share is public in one of them (hsstore.vllm.connector_state holds what the connectors share).
The package is read as source (no vLLM needed)."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "python" / "hsstore"


def private_imports(path):
    """(line, module, name) of each private name `path` imports from a module of the package."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        ours = node.level > 0 or (node.module or "").split(".")[0] == "hsstore"
        if not ours:
            continue
        for alias in node.names:
            # _hsstore is the native extension module itself, not a private name of a module.
            if alias.name.startswith("_") and alias.name != "_hsstore" and \
                    not alias.name.startswith("__"):
                found.append((node.lineno, node.module, alias.name))
    return found


def test_no_module_imports_another_modules_private_names():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 10
    found = [f"{path.relative_to(PACKAGE)}:{line} from {module} import {name}"
             for path in modules for line, module, name in private_imports(path)]
    assert found == []
