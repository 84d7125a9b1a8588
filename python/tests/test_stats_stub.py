"""HiddenStateStore.stats() is what python/hsstore/_hsstore.pyi declares: at every level (the top
dict, per_kind, remote, transfer, host_copy, ...) the keys of its TypedDict in the same order, each
value of the declared type. The stub itself is checked against the C++ field lists
(include/hss/detail/stats_fields.hpp) by tests/base/test_stats_fields.cpp."""

import ast
import pathlib

from conftest import CHUNK, Fixture, rows

STUB = pathlib.Path(__file__).resolve().parents[1] / "hsstore" / "_hsstore.pyi"
SCALARS = {"int": int, "bool": bool, "float": float, "str": str}


def typed_dicts():
    """{class name: [(field, annotation AST)]} of the stub's TypedDict classes, in stub order."""
    classes = {}
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.ClassDef) and any(
            isinstance(b, ast.Name) and b.id == "TypedDict" for b in node.bases
        ):
            classes[node.name] = [
                (item.target.id, item.annotation)
                for item in node.body
                if isinstance(item, ast.AnnAssign)
            ]
    return classes


def check(value, annotation, path, classes):
    """Asserts that value has the stub type `annotation`; returns the TypedDicts it walked."""
    where = f"stats(){path}"
    if isinstance(annotation, ast.Name) and annotation.id in SCALARS:
        # type() and not isinstance(): a bool is an int to isinstance().
        assert type(value) is SCALARS[annotation.id], f"{where}: {value!r} is not {annotation.id}"
        return set()
    if isinstance(annotation, ast.Name):
        fields = classes.get(annotation.id)
        assert fields is not None, f"{where}: the stub has no TypedDict {annotation.id}"
        assert isinstance(value, dict), f"{where}: {type(value).__name__}, not a dict"
        declared = [name for name, _ in fields]
        assert list(value) == declared, (
            f"{where}: the dict's keys {list(value)} are not class {annotation.id}'s {declared}"
        )
        walked = {annotation.id}
        for name, field_annotation in fields:
            walked |= check(value[name], field_annotation, f"{path}[{name!r}]", classes)
        return walked
    assert isinstance(annotation, ast.Subscript), f"{where}: unexpected stub type {ast.unparse(annotation)}"
    outer = annotation.value.id
    if outer == "Dict":  # Dict[str, X]: a per-kind dict
        _, item = annotation.slice.elts
        assert isinstance(value, dict) and value, f"{where}: {value!r} is not a non-empty dict"
        walked = set()
        for key, item_value in value.items():
            assert type(key) is str, f"{where}: key {key!r}"
            walked |= check(item_value, item, f"{path}[{key!r}]", classes)
        return walked
    assert outer == "List", f"{where}: unexpected stub type {ast.unparse(annotation)}"
    assert isinstance(value, list), f"{where}: {type(value).__name__}, not a list"
    walked = set()
    for i, item_value in enumerate(value):
        walked |= check(item_value, annotation.slice, f"{path}[{i}]", classes)
    return walked


def stats_annotation():
    """The return annotation of HiddenStateStore.stats in the stub."""
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == "HiddenStateStore":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "stats":
                    return item.returns
    raise AssertionError("the stub has no HiddenStateStore.stats")


def test_stats_dict_is_the_stubs_typed_dict():
    fix = Fixture()
    tokens = list(range(2 * CHUNK))
    fix.mark_kv_present(fix.keys_for(tokens))
    fix.store.store_hidden_states(tokens, rows(len(tokens)))
    fix.store.retrieve_hidden_states(tokens, like="numpy")
    classes = typed_dicts()
    annotation = stats_annotation()
    assert isinstance(annotation, ast.Name) and annotation.id == "HiddenStateStats"
    walked = check(fix.store.stats(), annotation, "", classes)
    assert {"HiddenStateStats", "KindStats", "RemoteStats", "TransferStats"} <= walked


def test_a_closed_stores_stats_keep_their_shape():
    fix = Fixture()
    fix.store.close()
    check(fix.store.stats(), stats_annotation(), "", typed_dicts())
