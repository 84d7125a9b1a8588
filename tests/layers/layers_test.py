#!/usr/bin/env python3
"""The folders of src/ are layers: a file includes only headers of its own folder or of folders
listed before it in src/CMakeLists.txt's HSS_SOURCE_LAYERS (the device path, datapath/cuda or
datapath/nocuda, sits right after datapath/host), and kernels/ includes nothing from src/.

    python3 tests/layers/layers_test.py [REPO]

Prints every arrow back up ("src/<file> -> src/<header>") and exits 1 when there is one; exit 0
with a count of the includes checked. Run by ctest (label unit).
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layers(repo):
    text = open(os.path.join(repo, "src", "CMakeLists.txt")).read()
    text = "\n".join(line.split("#")[0] for line in text.splitlines())
    block = re.search(r"set\(HSS_SOURCE_LAYERS(.*?)\)", text, re.S).group(1)
    order = block.split()
    device = order.index("datapath/host") + 1
    return order[:device] + ["datapath/cuda|datapath/nocuda"] + order[device:]


def layer_of(rel, order):
    """Index of the layer holding src-relative path `rel` (the deepest folder that is a layer)."""
    folder = os.path.dirname(rel)
    for i, name in enumerate(order):
        if folder in name.split("|"):
            return i
    return None


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    src = os.path.join(repo, "src")
    order = layers(repo)
    problems, checked = [], 0
    for root in ("src", "kernels"):
        for d, _, files in os.walk(os.path.join(repo, root)):
            for f in files:
                if not f.endswith((".cpp", ".hpp", ".cu", ".cuh")):
                    continue
                path = os.path.join(d, f)
                rel = os.path.relpath(path, os.path.join(repo, root))
                for name in INCLUDE.findall(open(path).read()):
                    target = os.path.normpath(os.path.join(src, name))
                    local = os.path.normpath(os.path.join(d, name))
                    if os.path.exists(local) and not local.startswith(src + os.sep):
                        continue  # a header beside it (kernels/, include/)
                    if not os.path.exists(target) and not (
                            os.path.exists(local) and local.startswith(src + os.sep)):
                        continue  # hss/... public, kernels/ or system headers
                    target = target if os.path.exists(target) else local
                    checked += 1
                    to = os.path.relpath(target, src)
                    if root == "kernels":
                        problems.append(f"kernels/{rel} -> src/{to} (kernels/ is below src/)")
                        continue
                    mine, theirs = layer_of(rel, order), layer_of(to, order)
                    if mine is None:
                        problems.append(f"src/{rel} is in no layer of HSS_SOURCE_LAYERS")
                    elif theirs is None:
                        problems.append(f"src/{rel} -> src/{to}: src/{to} is in no layer")
                    elif theirs > mine:
                        problems.append(f"src/{rel} ({order[mine]}) -> src/{to} ({order[theirs]}): "
                                        "an arrow back up")
    for p in problems:
        print(p)
    print(f"layers: {len(order)} ({' < '.join(order)}); {checked} includes checked, "
          f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
