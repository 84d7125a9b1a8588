"""python/hsstore/_hsstore.pyi names exactly what the native module has (classes, functions, and
each class's public methods and properties), so editors and type checkers see the real API."""

import ast
import re
import pathlib

from hsstore import _hsstore

STUB = pathlib.Path(__file__).resolve().parents[1] / "hsstore" / "_hsstore.pyi"
STUB_ONLY = {"TokenIds", "Tensor", "Like", "Kind", "Chunk", "BatchItem", "StorageManagerLike"}


def is_typed_dict(node):
    """A TypedDict of the stub (the stats dicts): a stub-only name, checked by test_stats_stub.py."""
    return isinstance(node, ast.ClassDef) and any(
        isinstance(b, ast.Name) and b.id == "TypedDict" for b in node.bases
    )


def stub_names():
    tree = ast.parse(STUB.read_text())
    top, members, bases = set(), {}, {}
    for node in tree.body:
        if is_typed_dict(node):
            continue
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


def _parameters(function_def):
    args = function_def.args
    positional = [a.arg for a in args.posonlyargs + args.args if a.arg != "self"]
    return positional, [a.arg for a in args.kwonlyargs]


def _runtime_parameters(function):
    """Parameter names of a nanobind function, from the signature nanobind records for it."""
    signature = function.__nb_signature__[0][0]
    signature = re.sub(r"\\\d+", "...", signature)  # defaults are \0, \1, ... placeholders
    tree = ast.parse(signature.replace("def (", "def f(", 1) + ": ...")
    return _parameters(tree.body[0])


def test_stub_signatures_match_module():
    """Every function and method of the stub takes the parameters the module takes (names,
    order, keyword-only markers), as nanobind records them."""
    tree = ast.parse(STUB.read_text())
    checked = 0
    for node in tree.body:
        scopes = []
        if isinstance(node, ast.FunctionDef) and hasattr(_hsstore, node.name):
            scopes.append((node, getattr(_hsstore, node.name)))
        elif isinstance(node, ast.ClassDef) and node.name not in STUB_ONLY:
            cls = getattr(_hsstore, node.name, None)
            for item in node.body:
                if not isinstance(item, ast.FunctionDef) or cls is None:
                    continue
                if any(isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list):
                    continue
                member = cls.__dict__.get(item.name)
                if item.name.startswith("__") and item.name != "__init__":
                    continue  # operators: nanobind names their operand "arg"
                if member is None or not hasattr(member, "__nb_signature__"):
                    continue
                scopes.append((item, member))
        for stub_def, member in scopes:
            assert _parameters(stub_def) == _runtime_parameters(member), stub_def.name
            checked += 1
    assert checked > 40
