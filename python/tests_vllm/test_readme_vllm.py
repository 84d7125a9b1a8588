"""docs/vllm.md's quick start (the README's vLLM link) runs as written (in a process of its own: it
builds an engine with vLLM's default worker process, and LMCache keeps one engine per process)."""

import pathlib
import re
import subprocess
import sys

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "vllm.md"


def vllm_quick_start() -> str:
    section = GUIDE.read_text().split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "docs/vllm.md: no ```python block in the Quick start section"
    return match.group(1)


def test_readme_vllm_quick_start_runs(tmp_path):
    script = tmp_path / "quick_start.py"  # a file, as a user would run it (spawn re-imports it)
    script.write_text(vllm_quick_start())
    # Output to files, not pipes: vLLM's helper processes (multiprocessing's resource tracker)
    # may hold inherited pipes open after the script has exited.
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        code = subprocess.run([sys.executable, str(script)], stdout=out, stderr=err,
                              timeout=600).returncode
    stdout = out_path.read_text()
    assert code == 0, err_path.read_text()[-4000:]
    # The second request's 1024-token prefix was a hit, and the consumer holds all 1104 rows of
    # both layers (vLLM logs to stdout too, around the line printed).
    assert "1024 {-1: (1104, 256), 2: (1104, 256)}" in stdout.splitlines(), stdout[-2000:]
