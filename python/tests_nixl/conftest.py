"""Two (or three) real processes on loopback for the NIXL tests: each a peer.py with its own engine
and NIXL agent, UCX over TCP on loopback (UCX_TLS=tcp,self, UCX_NET_DEVICES=lo: the network
path RDMA replaces, kept off every interface but lo). Every process is
started before any agent is made (NIXL's rule), then sent "init".

The tests need the nixl package (scripts/nixl_venv installs it; `make test-nixl` runs them there);
they are skipped only where it is absent."""

import json
import os
import subprocess
import sys
import threading

import pytest

pytest.importorskip("nixl", reason="the nixl package is not installed (scripts/nixl_venv)")

HERE = os.path.dirname(os.path.abspath(__file__))
CHUNK = 256
# Every peer of these tests shares it (the control channel needs a key, docs/design.md "Threat
# model"); a test passes hidden_state_mac_key=None for an unkeyed peer.
SHARED_KEY = "decode-and-prefill-share-this-secret"


def config(pool_mib, **extra):
    c = {
        "chunk_size": CHUNK,
        "enable_hidden_state_cache": True,
        "max_hidden_state_cpu_size": pool_mib / 1024.0,
        "hidden_state_transfer": "nixl",
        "hidden_state_transfer_timeout_ms": 10000,
        "hidden_state_mac_key": SHARED_KEY,
    }
    c.update(extra)
    return {k: v for k, v in c.items() if v is not None}


class Peer:
    """A peer.py process: send() a command, get its JSON reply (bounded by a timeout)."""

    def __init__(self, role, cfg):
        env = dict(os.environ)
        env.setdefault("UCX_TLS", "tcp,self")
        env.setdefault("UCX_NET_DEVICES", "lo")  # loopback only, never the host's own interface
        env.setdefault("HSS_LOG_LEVEL", "warn")
        env["NIXL_LOG_LEVEL"] = env.get("NIXL_LOG_LEVEL", "WARN")
        self.role = role
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "peer.py"), json.dumps(cfg), role],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        self.stderr = []
        threading.Thread(target=self._drain, daemon=True).start()
        self.pid = self.proc.pid
        self.address = None

    def _drain(self):
        for line in self.proc.stderr:
            self.stderr.append(line)

    def write(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def read(self, timeout=60):
        result = {}

        def get():
            result["line"] = self.proc.stdout.readline()

        t = threading.Thread(target=get, daemon=True)
        t.start()
        t.join(timeout)
        assert "line" in result, f"{self.role}: no reply in {timeout} s; stderr: {''.join(self.stderr[-20:])}"
        assert result["line"], f"{self.role} exited; stderr: {''.join(self.stderr[-30:])}"
        reply = json.loads(result["line"])
        assert "error" not in reply, f"{self.role}: {reply['error']}\n{reply.get('trace', '')}"
        return reply

    def send(self, timeout=60, **cmd):
        self.write(**cmd)
        return self.read(timeout)

    def init(self):
        reply = self.send(cmd="init")
        self.address = reply["address"]
        return reply

    def close(self):
        if self.proc.poll() is None:
            try:
                self.write(cmd="exit")
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, BrokenPipeError):
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def peers():
    """peers(('producer', cfg), ('consumer', cfg), ...) -> started and initialised Peers."""
    made = []

    def make(*specs):
        group = [Peer(role, cfg) for role, cfg in specs]  # all processes first
        made.extend(group)
        for p in group:
            p.init()
        return group

    yield make
    for p in made:
        p.close()
