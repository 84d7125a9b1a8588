#!/usr/bin/env python3
"""`.ci/run` runs the README's test command exactly as a user types it (issue 54 §2).

    python3 tests/build_checks/ci_runs_the_readme_command_test.py [REPO]

The README's command is the `make test` line of its first code block. `.ci/run` must run that
command with nothing added (no variable, no target, no flag: `stage make test`), and the Makefile
must have no knob that leaves part of `make test` out (the `MODEL=0` form that once hid a red
README behind a green CI). Prints what is wrong and exits 1; exit 0 otherwise.
"""
import os
import re
import sys


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    readme = open(os.path.join(repo, "README.md"), encoding="utf-8").read()
    first_block = re.search(r"```(?:sh|bash)?\n(.*?)```", readme, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    test_commands = [c for c in commands if c.startswith("make test")]
    problems = []
    if test_commands != ["make test"]:
        problems.append(f"the README's first code block has test commands {test_commands}, "
                        "expected exactly ['make test']")
    ci = open(os.path.join(repo, ".ci", "run"), encoding="utf-8").read()
    ci_lines = [line.strip() for line in ci.splitlines() if not line.strip().startswith("#")]
    make_test = [line for line in ci_lines if re.search(r"\bmake\s+test\b(?!-)", line)]
    if make_test != ["stage make test"]:
        problems.append(f".ci/run runs `make test` as {make_test}, expected exactly "
                        "['stage make test'] (once, with nothing added)")
    makefile = open(os.path.join(repo, "Makefile"), encoding="utf-8").read()
    recipe = re.search(r"^test:[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.M)
    if not recipe:
        problems.append("the Makefile has no `test:` target")
    else:
        for variable in re.findall(r"\$\(([A-Z_]+)\)", recipe.group(1)):
            if variable not in ("BUILD_DIR", "JOBS", "MAKE"):
                problems.append(f"`make test`'s recipe depends on $({variable}): a knob that can "
                                "leave part of it out")
        if "test-model" not in recipe.group(1):
            problems.append("`make test` does not run the model tree (test-model)")
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(".ci/run runs the README's `make test` as written; `make test` has no reduced form")
    return 0


if __name__ == "__main__":
    sys.exit(main())
