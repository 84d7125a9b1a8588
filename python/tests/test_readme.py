"""The README's Python quick start runs as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_quick_start() -> str:
    text = README.read_text()
    section = text.split("\n## Python\n", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README.md: no ```python block in the Python section"
    return match.group(1)


def test_readme_python_quick_start_runs(capsys):
    exec(compile(python_quick_start(), str(README), "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("2 ['vllm@@1@0@")
