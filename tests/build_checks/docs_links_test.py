#!/usr/bin/env python3
"""Every link in the docs resolves, and every pointer from the code to a docs section names one.

    python3 tests/build_checks/docs_links_test.py [REPO]

Checks, over README.md and docs/*.md (issue 57 §4):
  * every relative link `[text](path)` names a file or folder of the repository, and its
    `#anchor` (also a link to `#anchor` on the same page) is the GitHub anchor of one of the
    target's headings;
  * every quoted pointer `docs/<name>.md, "Section"` (or `<name>.md, "Section"` inside docs/) in
    the docs and in the sources (src, include, kernels, python, tests, scripts, bench, tools,
    profiling, cmake, Makefile, CMakeLists.txt, .ci) starts a heading or a bold paragraph lead
    (`**Section...`) of that file, so a section that moves or is renamed fails here, not in a
    reader's hands.
Prints each broken link or pointer and exits 1; exit 0 otherwise.
"""
import os
import re
import sys

DOC_NAMES = ("design", "perf", "reliability", "stats", "kernels", "vllm")
CODE_ROOTS = ("src", "include", "kernels", "python", "tests", "scripts", "bench", "tools",
              "profiling", "cmake", ".ci", "Makefile", "CMakeLists.txt")
SKIP_DIRS = {"__pycache__", ".git", "build"}
BINARY_SUFFIXES = {".png", ".so", ".pyc", ".o", ".a", ".gz", ".safetensors"}


def github_anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces as '-'."""
    text = re.sub(r"<[^>]+>", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def strip_code_blocks(text):
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def headings(text):
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", strip_code_blocks(text), re.M)]


def anchors(text):
    seen, out = {}, set()
    for h in headings(text):
        a = github_anchor(h)
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f"{a}-{n}")
    return out


def section_names(text):
    """Headings and bold paragraph leads, the names a quoted pointer may start."""
    names = [re.sub(r"`", "", h) for h in headings(text)]
    names += [re.sub(r"`", "", m.group(1)) for m in re.finditer(r"(?:^|\n)[*-]? ?\*\*([^*]+)\*\*", text)]
    return names


def flat(text):
    """The text with comment and line-continuation markers joined, so a pointer split over two
    comment lines reads as one."""
    return re.sub(r"\n[ \t]*(?://+|#+|\*|;)?[ \t]*", " ", text)


def check_links(repo, path, text, docs_text):
    problems = []
    base = os.path.dirname(path)
    body = strip_code_blocks(text)
    body = re.sub(r"`[^`\n]*`", "", body)  # inline code is not a link
    for m in re.finditer(r"\[[^\]]*\]\(([^)\s]+)\)", body):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        file_part, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(base, file_part)) if file_part else path
        rel = os.path.relpath(path, repo)
        if not os.path.exists(full):
            problems.append(f"{rel}: link to {target}: {os.path.relpath(full, repo)} does not exist")
            continue
        if anchor:
            if full not in docs_text:
                if not full.endswith(".md"):
                    problems.append(f"{rel}: link to {target}: an anchor into a file that is not markdown")
                    continue
                docs_text[full] = open(full, encoding="utf-8").read()
            if anchor not in anchors(docs_text[full]):
                problems.append(f"{rel}: link to {target}: no heading of "
                                f"{os.path.relpath(full, repo)} has the anchor #{anchor}")
    return problems


POINTER = re.compile(r"(?<![\w/])(?:docs/)?(" + "|".join(DOC_NAMES) + r")\.md['\"`]?,?\s+"
                     r"(?:section\s+)?\"([^\"]{3,120})\"")


def check_pointers(repo, rel, text, names_of):
    problems = []
    for m in POINTER.finditer(flat(text)):
        doc, name = m.group(1), m.group(2).strip().rstrip(".,;:")
        name = re.sub(r"`", "", name)
        if doc not in names_of:
            continue  # a doc that does not exist: the link check reports files
        if not any(n.startswith(name) for n in names_of[doc]):
            problems.append(f"{rel}: points to docs/{doc}.md, \"{name}\": no heading or bold "
                            f"lead of docs/{doc}.md starts so")
    return problems


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    docs = [os.path.join(repo, "README.md")]
    docs_dir = os.path.join(repo, "docs")
    docs += sorted(os.path.join(docs_dir, f) for f in os.listdir(docs_dir) if f.endswith(".md"))
    docs_text = {p: open(p, encoding="utf-8").read() for p in docs}
    names_of = {}
    for name in DOC_NAMES:
        p = os.path.join(docs_dir, name + ".md")
        if p in docs_text:
            names_of[name] = section_names(docs_text[p])
    problems = []
    for p in docs:
        problems += check_links(repo, p, docs_text[p], docs_text)
        problems += check_pointers(repo, os.path.relpath(p, repo), docs_text[p], names_of)
    for root in CODE_ROOTS:
        top = os.path.join(repo, root)
        files = [top] if os.path.isfile(top) else []
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
            files += [os.path.join(dirpath, f) for f in filenames]
        for f in files:
            if os.path.splitext(f)[1] in BINARY_SUFFIXES or os.path.islink(f):
                continue
            try:
                text = open(f, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            problems += check_pointers(repo, os.path.relpath(f, repo), text, names_of)
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"{len(docs)} documents: every relative link, anchor and quoted section pointer resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
