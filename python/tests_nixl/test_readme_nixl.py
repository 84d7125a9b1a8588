"""docs/vllm.md's P/D quick start (the README's NIXL link) runs as written: its prefill block in one
process, its decode block in another (on a free port instead of 5555)."""

import os
import pathlib
import re
import socket
import subprocess
import sys

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "vllm.md"


def blocks():
    section = GUIDE.read_text().split("\n## Prefill and decode on different hosts", 1)[1]
    section = section.split("\n## ", 1)[0]
    found = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(found) == 2, "docs/vllm.md: the P/D section has a prefill and a decode block"
    return found


def test_readme_pd_quick_start_runs():
    prefill, decode = blocks()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = dict(os.environ)
    env.setdefault("UCX_TLS", "tcp,self")
    env.setdefault("UCX_NET_DEVICES", "lo")
    producer = subprocess.Popen([sys.executable, "-c", prefill.replace("5555", port)], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = producer.stdout.readline()
        while line and not line.startswith("serving on"):  # NIXL logs to stdout too
            line = producer.stdout.readline()
        assert line.startswith("serving on 127.0.0.1:" + port), line
        out = subprocess.run([sys.executable, "-c", decode.replace("5555", port) +
                              "\nimport numpy\nassert all((r == l).all() for r, l in zip(rows, (0, 5, -1)))\n"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        printed = [l for l in out.stdout.splitlines() if "NIXL" not in l]
        assert printed == ["4096 None"], out.stdout
    finally:
        producer.communicate("\n", timeout=30)
