"""The README's vLLM quick start runs as written (in a process of its own: it builds an engine with
vLLM's default worker process, and LMCache keeps one engine per process)."""

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def vllm_quick_start() -> str:
    section = README.read_text().split("\n## vLLM\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README.md: no ```python block in the vLLM section"
    return match.group(1)


def test_readme_vllm_quick_start_runs(tmp_path):
    script = tmp_path / "quick_start.py"  # a file, as a user would run it (spawn re-imports it)
    script.write_text(vllm_quick_start())
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    last = done.stdout.strip().splitlines()[-1]
    # The second request's 1024-token prefix was a hit, and the consumer holds all 1104 rows of
    # both layers.
    assert last == "1024 {-1: (1104, 256), 2: (1104, 256)}", done.stdout[-2000:]
