#!/usr/bin/env python3
"""The HSS_* environment variables are read in the config layer only (docs/design.md, "Layers"):
the C++ library and its Python bindings call getenv nowhere but in src/config/ (config_env.cpp,
the HSS_* variables; config.cpp, LMCACHE_*), and the Python package reads an HSS_* variable
nowhere but in python/hsstore/config_env.py. Tests, benchmarks and scripts keep their own.

    python3 tests/layers/env_reads_test.py [REPO]

Prints every read elsewhere ("<file>:<line>: <text>") and exits 1 when there is one; exit 0 with
a count of the files checked. Run by ctest (label unit).
"""
import os
import re
import sys

# A C or C++ read of the environment: getenv, secure_getenv, environ, ::getenv.
NATIVE_READ = re.compile(r"\b(secure_getenv|getenv|environ)\b")
NATIVE_READERS = ("src/config/",)
# A Python read of an HSS_* variable: os.environ["HSS_..."], os.environ.get("HSS_..."),
# os.getenv("HSS_..."), environ.setdefault("HSS_...") and the like.
PYTHON_READ = re.compile(r"""\b(environ|getenv)\b[^\n]*?["']HSS_""")
PYTHON_READERS = ("python/hsstore/config_env.py",)


def code_lines(text, comment):
    """(line number, text) of each line with its comment stripped (a C++ // or /* */ comment, or
    a Python # comment; docstrings are prose and may name variables, so Python code is what
    matches the read pattern, a call)."""
    if comment == "//":
        text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    for number, line in enumerate(text.splitlines(), 1):
        yield number, line.split(comment, 1)[0]


def files(repo, top, suffixes):
    for root, _, names in os.walk(os.path.join(repo, top)):
        for name in sorted(names):
            if name.endswith(suffixes):
                yield os.path.relpath(os.path.join(root, name), repo)


def reads(repo):
    found, checked = [], 0
    for top in ("src", "python/src"):
        for rel in files(repo, top, (".cpp", ".hpp", ".h", ".cu", ".cuh")):
            checked += 1
            if rel.startswith(NATIVE_READERS):
                continue
            text = open(os.path.join(repo, rel), encoding="utf-8").read()
            for number, line in code_lines(text, "//"):
                if NATIVE_READ.search(line):
                    found.append(f"{rel}:{number}: {line.strip()}")
    for rel in files(repo, "python/hsstore", (".py",)):
        checked += 1
        if rel in PYTHON_READERS:
            continue
        text = open(os.path.join(repo, rel), encoding="utf-8").read()
        for number, line in code_lines(text, "#"):
            if PYTHON_READ.search(line):
                found.append(f"{rel}:{number}: {line.strip()}")
    return found, checked


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    found, checked = reads(repo)
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} environment reads outside the config layer")
        return 1
    if checked < 50:
        print(f"only {checked} files found under {repo}: wrong repository?")
        return 1
    print(f"{checked} files checked: HSS_* variables read in the config layer only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
