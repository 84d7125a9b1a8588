"""A real `lmcache server` (LMCache 0.5.6's multi-process mode) for the MP tests: started on free
loopback ports in a temporary directory, stopped (and waited for) on exit, so nothing is left
running. No usage reports (DO_NOT_TRACK, LMCACHE_TRACK_USAGE): the tests make no outbound
connection. A server that does not come up fails the test with its log: it is never faked or
skipped."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from typing import Iterator, List, Optional

import pytest

STARTUP_TIMEOUT_S = 120.0  # ~5 s on an idle machine; 2 shared cores under a vLLM build are slower


def free_ports(count: int) -> List[int]:
    """`count` distinct loopback ports nothing listens on now (bound, then released)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


class LMCacheServer:
    """One `lmcache server` process (engine-driven transfers, LRU L1 in memory). start(),
    kill() (SIGKILL: a crash) and restart() on the same ports (an empty cache)."""

    def __init__(self, directory: pathlib.Path, *, chunk_size: int = 256,
                 l1_size_gb: float = 0.5) -> None:
        self.directory = directory
        self.chunk_size = chunk_size
        self.l1_size_gb = l1_size_gb
        self.port, self.http_port, self.prometheus_port = free_ports(3)
        self.process: Optional[subprocess.Popen] = None
        self.starts = 0

    @property
    def client_config(self) -> dict:
        """The LMCache keys of an MP client ("lmcache." is prefixed by HiddenStates)."""
        return {"mp.host": "tcp://127.0.0.1", "mp.port": self.port}

    def _command(self) -> List[str]:
        executable = pathlib.Path(sys.executable).parent / "lmcache"
        return [str(executable), "server", "--host", "127.0.0.1", "--port", str(self.port),
                "--http-host", "127.0.0.1", "--http-port", str(self.http_port),
                "--prometheus-port", str(self.prometheus_port),
                "--l1-size-gb", str(self.l1_size_gb), "--no-l1-use-lazy",
                "--eviction-policy", "LRU", "--chunk-size", str(self.chunk_size),
                "--supported-transfer-mode", "engine_driven"]

    def log_tail(self, chars: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return (self.directory / f"server-{self.starts}.log").read_text()[-chars:]
        return ""

    def start(self) -> None:
        assert self.process is None, "already running"
        self.starts += 1
        env = dict(os.environ, DO_NOT_TRACK="1", LMCACHE_TRACK_USAGE="false",
                   LMCACHE_DISABLE_BANNER="1", PYTHONHASHSEED=os.environ.get("PYTHONHASHSEED", "0"))
        log = open(self.directory / f"server-{self.starts}.log", "wb")
        with log:
            # A session of its own: kill() reaches the server's children too.
            self.process = subprocess.Popen(self._command(), cwd=self.directory, env=env,
                                            stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not (_accepts(self.port) and _accepts(self.http_port)):
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                pytest.fail(f"lmcache server exited with {code} at start-up:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"lmcache server not listening after {STARTUP_TIMEOUT_S} s:\n"
                            f"{self.log_tail()}")
            time.sleep(0.2)

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def kill(self) -> None:
        """SIGKILL, as a crash: no clean shutdown, the cache is gone."""
        if self.process is None:
            return
        self._signal(signal.SIGKILL)
        self.process.wait(timeout=60)
        self.process = None
        while _accepts(self.port):  # the port is free again before a restart binds it
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within 20 s."""
        if self.process is None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait(timeout=60)
        self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()


@contextlib.contextmanager
def lmcache_server(directory: pathlib.Path, **kwargs) -> Iterator[LMCacheServer]:
    server = LMCacheServer(directory, **kwargs)
    server.start()
    try:
        yield server
    finally:
        server.stop()
