"""The vLLM connectors' ``hsstore.*`` keys live in one table (hsstore.vllm.connector_keys): the
docs/vllm.md's "vLLM connector keys" table is that table row by row, and no other module of
hsstore.vllm reads a key but through it (as the native keys: tests/config/test_config_keys.cpp).
No vLLM needed: the modules are read as source."""

import ast
import json
import pathlib

import pytest

from hsstore.vllm.connector_keys import CONFIG, KEYS, REQUEST, option

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "hsstore" / "vllm"
TABLE_MODULE = "connector_keys.py"


def readme_rows():
    """The rows of docs/vllm.md's "## vLLM connector keys" table, as written."""
    lines = (ROOT / "docs" / "vllm.md").read_text().splitlines()
    start = lines.index("## vLLM connector keys")
    rows, in_table = [], False
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if not line.startswith("| "):
            if in_table:
                break
            continue
        in_table = True
        if line.startswith("| `"):
            rows.append(line)
    return rows


def test_readme_lists_every_connector_key_with_its_default_and_meaning():
    expected = [f"| `{key.name}` | {key.where} | `{json.dumps(key.default)}` | {key.doc} |"
                for key in KEYS.values()]
    assert readme_rows() == expected


def test_every_key_says_where_it_is_given():
    assert {key.where for key in KEYS.values()} == {CONFIG, REQUEST}
    assert all(name.startswith("hsstore.") and key.name == name for name, key in KEYS.items())


def test_option_reads_the_given_value_else_a_fresh_default():
    assert option({"hsstore.keep": False}, "hsstore.keep") is False
    assert option({}, "hsstore.keep") is True
    layers = option({}, "hsstore.layers")
    assert layers == [-1]
    layers.append(3)  # a caller's change never reaches the table's default
    assert option({}, "hsstore.layers") == [-1]
    with pytest.raises(KeyError):
        option({"hsstore.unknown": 1}, "hsstore.unknown")


def key_uses(path):
    """(line, key, how) of every "hsstore.<name>" literal that names a key in `path`: read with
    .get/.pop/[...] ("read"), written as a subscript or a dict literal's key ("written"), or
    passed to option() or default_of() ("option")."""
    tree = ast.parse(path.read_text(), str(path))
    uses = []

    def key_of(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value.startswith("hsstore."):
            return node.value
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            key = key_of(node.args[0])
            func = node.func
            if key and isinstance(func, ast.Attribute) and func.attr in ("get", "pop",
                                                                         "setdefault"):
                uses.append((node.lineno, key, "read"))
            elif isinstance(func, ast.Name) and func.id == "option" and len(node.args) > 1 \
                    and key_of(node.args[1]):
                uses.append((node.lineno, key_of(node.args[1]), "option"))
            elif isinstance(func, ast.Name) and func.id == "default_of" and key:
                uses.append((node.lineno, key, "option"))
        elif isinstance(node, ast.Subscript):
            key = key_of(node.slice)
            if key:
                uses.append((node.lineno, key,
                             "read" if isinstance(node.ctx, ast.Load) else "written"))
        elif isinstance(node, ast.Dict):
            for k in node.keys:
                key = key_of(k) if k is not None else None
                if key:
                    uses.append((node.lineno, key, "written"))
    return uses


def test_no_module_reads_a_connector_key_but_through_the_table():
    modules = sorted(p for p in PACKAGE.glob("*.py") if p.name != TABLE_MODULE)
    assert len(modules) > 5
    reads, unknown, options = [], [], 0
    for path in modules:
        for line, key, how in key_uses(path):
            where = f"{path.name}:{line} {key}"
            if how == "read":
                reads.append(where)
            elif key not in KEYS:
                unknown.append(where)
            options += how == "option"
    assert reads == [], "read ad hoc, not through connector_keys.option()"
    assert unknown == [], "not in connector_keys' table"
    assert options >= 10  # the scan sees the reads: connector, identity, transfer, aux_outputs
