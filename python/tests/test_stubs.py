"""python/hsstore/_hsstore.pyi names exactly what the native module has (classes, functions, and
each class's public methods and properties), so editors and type checkers see the real API."""

import ast
import pathlib

from hsstore import _hsstore

STUB = pathlib.Path(__file__).resolve().parents[1] / "hsstore" / "_hsstore.pyi"
STUB_ONLY = {"TokenIds", "Tensor", "Like", "Kind", "Chunk", "BatchItem", "StorageManagerLike"}


def stub_names():
    tree = ast.parse(STUB.read_text())
    top, members, bases = set(), {}, {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            top.add(node.name)
        elif isinstance(node, ast.Assign):
            top.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.ClassDef):
            names = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    names.add(item.name)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
            members[node.name] = names
            bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
    for name, base_names in bases.items():  # inherited members count as the class's
        for base in base_names:
            members[name] |= members.get(base, set())
    return top, members


def public(names):
    return {n for n in names if not n.startswith("__")}


def test_stub_matches_module():
    top, members = stub_names()
    runtime = public(dir(_hsstore)) - {"annotations"}
    assert runtime == public(top) - STUB_ONLY
    for cls_name, names in members.items():
        if cls_name in STUB_ONLY or cls_name in ("Error", "ConfigError", "InvalidArgument"):
            continue
        cls = getattr(_hsstore, cls_name)
        have = {n for n in public(dir(cls)) if not n.startswith("_")}
        if cls_name == "ActivationKind":
            have = set(cls.__members__)
        assert have == public(names), cls_name
