#!/usr/bin/env python3
"""Line coverage of the lines a branch added under src/ (git diff -U0 BASE -- src), from gcov over a
--coverage build tree (preset model-coverage) after the tests ran: every object of
src/CMakeFiles/hss.dir, headers merged over the objects that include them (a line counts as run
when any object ran it). Usage: scripts/new_line_coverage.py REPO BUILD BASE"""
import os, re, subprocess, sys, glob, collections
repo, build, base = sys.argv[1], sys.argv[2], sys.argv[3]
diff = subprocess.run(["git", "-C", repo, "diff", "-U0", base, "--", "src"], capture_output=True, text=True).stdout
added = collections.defaultdict(set)
cur = None
for line in diff.splitlines():
    if line.startswith("+++ "):
        cur = line[6:] if line.startswith("+++ b/") else None
    elif line.startswith("@@") and cur:
        m = re.search(r"\+(\d+)(?:,(\d+))?", line)
        start, n = int(m.group(1)), int(m.group(2) or 1)
        added[cur].update(range(start, start + n))
objdir = os.path.join(build, "src/CMakeFiles/hss.dir")
work = os.path.join(build, "new-line-coverage")
os.makedirs(work, exist_ok=True)
for f in glob.glob(work + "/*"): os.remove(f)
objs = glob.glob(objdir + "/**/*.o", recursive=True)
state = collections.defaultdict(dict)  # file -> line -> run(bool) for executable lines
for o in objs:
    subprocess.run(["gcov", "-l", "-p", "-o", o, o[:-2].replace(objdir + "/", repo + "/src/")], cwd=work, capture_output=True)
for g in glob.glob(work + "/*.gcov"):
    src = None
    for line in open(g, errors="replace"):
        parts = line.split(":", 2)
        if len(parts) < 3: continue
        cnt, no = parts[0].strip(), parts[1].strip()
        if no == "0":
            if parts[2].startswith("Source:"): src = os.path.realpath(parts[2][7:].strip())
            continue
        if src is None or not src.startswith(repo + "/src/"): continue
        rel = os.path.relpath(src, repo)
        if rel not in added: continue
        ln = int(no)
        if ln not in added[rel] or cnt == "-" or cnt.startswith("="): continue
        run = cnt != "#####" and not cnt.startswith("#")
        state[rel][ln] = state[rel].get(ln, False) or run
tl = tr = 0
print(f"{'file':52} {'new lines':>9} {'run':>6} {'percent':>8}")
for rel in sorted(state):
    lines = state[rel]; r = sum(lines.values()); t = len(lines)
    tl += t; tr += r
    print(f"{rel:52} {t:9d} {r:6d} {100*r/t:7.1f}%")
print(f"{'total':52} {tl:9d} {tr:6d} {100*tr/max(tl,1):7.1f}%")
print("new lines never executed:")
for rel in sorted(state):
    for ln, run in sorted(state[rel].items()):
        if not run:
            print(f"  {rel}:{ln}: {open(os.path.join(repo, rel)).read().splitlines()[ln-1].strip()}")
