#!/usr/bin/env python3
"""One definition per class name in a namespace, across src/ and kernels/ (issue 54 §3).

    python3 tests/build_checks/one_definition_test.py [REPO]

The headers are checked by the compiler (hss_every_internal_header: one translation unit includes
them all, so a second definition is a redefinition error). This script covers what that cannot:
a class defined in a .cpp file in a named namespace (outside `namespace {`), against every other
definition of its name in the same namespace, in .cpp or .hpp files. It reads namespace-scope
definitions the way this tree writes them (clang-format: namespaces not indented), so a
`class X {` or `struct X {` at column 0 is at namespace scope (`struct X::Part {`, a nested
class defined out of line, counts under its qualified name). Prints each name defined twice
with its places and exits 1; exit 0 with the count of definitions checked.
"""
import os
import re
import sys

OPEN_NAMESPACE = re.compile(r"^namespace\s*([\w:]*)\s*\{")
CLOSE_NAMESPACE = re.compile(r"^\}\s*//\s*namespace")
DEFINITION = re.compile(r"^(?:template\s*<[^>]*>\s*)?(?:class|struct)\s+(?:\[\[[^\]]*\]\]\s*)?(\w+(?:::\w+)*)"
                        r"(?:\s+final)?\s*(?::(?!:)[^;{]*)?\{")


def definitions(path):
    """(namespace, name, line) of each namespace-scope class definition; '' for anonymous."""
    stack, found = [], []
    with open(path, encoding="utf-8") as source:
        for number, line in enumerate(source, 1):
            opened = OPEN_NAMESPACE.match(line)
            if opened:
                stack.append(opened.group(1) or "")
                if line.rstrip().endswith("}"):  # namespace x {} on one line
                    stack.pop()
                continue
            if CLOSE_NAMESPACE.match(line) and stack:
                stack.pop()
                continue
            defined = DEFINITION.match(line)
            if defined:
                anonymous = "" in stack
                found.append(("" if anonymous else "::".join(stack), defined.group(1), number))
    return found


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    places = {}
    for root in ("src", "kernels"):
        for folder, _, files in os.walk(os.path.join(repo, root)):
            for name in sorted(files):
                if not name.endswith((".cpp", ".hpp")):
                    continue
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, repo)
                for namespace, cls, line in definitions(path):
                    if namespace:  # an anonymous namespace's class is its file's own
                        places.setdefault((namespace, cls), []).append(f"{rel}:{line}")
    twice = {key: where for key, where in places.items() if len(where) > 1}
    for (namespace, cls), where in sorted(twice.items()):
        print(f"{namespace}::{cls} is defined {len(where)} times: {', '.join(where)}")
    if twice:
        return 1
    print(f"{len(places)} namespace-scope classes, each defined once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
