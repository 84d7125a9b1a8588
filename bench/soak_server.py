"""The soak's server side (bench/soak.py): the test model, a restartable redis-server, the
``vllm serve`` configuration, and the readings of its processes and log."""

from __future__ import annotations

import contextlib
import pathlib
import platform
import re
import shutil
import subprocess
import time
from typing import Any, Dict, Iterator

import engines
from conftest import CPU_KV, STEP_TOKENS
from lmcache_server import free_ports
from serving import complete, metrics, post, vllm_serve

__all__ = ["CHUNK", "HIDDEN", "LAYERS", "RedisServer", "check_log", "complete", "cpu_model",
           "describe", "metrics", "misses_by_cause", "post", "rss_bytes", "serve", "write_model"]

CHUNK = STEP_TOKENS  # LMCache's chunk: every prefill step starts on a chunk boundary
HIDDEN = engines.TINY["hidden_size"]
LAYERS = [-1, 1]
# Small pools, so that pressure never stops: a (chunk, layer) entry is 256 KiB, a chunk's KV
# 2 MiB. 16 chunks' hidden states (of the 17 the shared prefixes span) and 64 chunks' KV.
HS_POOL_GB = 8 / 1024
KV_POOL_GB = 128 / 1024
REDIS_TIMEOUT_MS = 500


def write_model(directory: pathlib.Path) -> pathlib.Path:
    return engines.write_llama(directory)


def describe() -> Dict[str, Any]:
    return {"model": engines.TINY, "layers": LAYERS, "chunk": CHUNK,
            "hidden_state_pool_gb": HS_POOL_GB, "kv_pool_gb": KV_POOL_GB,
            "redis_timeout_ms": REDIS_TIMEOUT_MS}


class RedisServer:
    """A throw-away redis-server on one loopback port for the whole run (no persistence):
    restart() kills it (SIGKILL) and starts an empty one on the same port."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.binary = shutil.which("redis-server")
        assert self.binary, "redis-server is missing (scripts/bootstrap installs it)"
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_ports(1)[0]
        self.url = f"redis://127.0.0.1:{self.port}"
        self.proc: Any = None
        self.restarts = 0

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not self.accepts():
            assert self.proc.poll() is None, "redis-server exited at start"
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)

    def accepts(self) -> bool:
        import socket

        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port),
                                                                    timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
        return False

    def restart(self, down_s: float) -> None:
        self.proc.kill()
        self.proc.wait()
        time.sleep(down_s)
        self.start()
        self.restarts += 1

    def __enter__(self) -> "RedisServer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def serve(model_dir: pathlib.Path, out_dir: pathlib.Path, redis_url: str,
          log_path: pathlib.Path, *, engine_seqs: int) -> Iterator[Any]:
    lmcache = engines.lmcache_config(kv_gb=KV_POOL_GB, hs_gb=HS_POOL_GB, extra_config={
        "hidden_state_remote_url": redis_url, "hidden_state_remote_timeout_ms": REDIS_TIMEOUT_MS})
    extra = {"hsstore.layers": LAYERS, "hsstore.keep": False,
             "hsstore.output_dir": str(out_dir), "hsstore.worker_init": CPU_KV,
             **{f"lmcache.{k}": v for k, v in lmcache.items()}}
    with vllm_serve(model_dir, extra, log_path, step_tokens=STEP_TOKENS,
                    args=["--max-num-seqs", str(engine_seqs)],
                    env={"VLLM_SERVER_DEV_MODE": "1", "HSS_LOG_LEVEL": "info"}) as server:
        yield server


def rss_bytes(pid: int) -> Dict[str, int]:
    """Resident bytes of the server ("api") and of every process under it (the engine core,
    vLLM's helpers), and their "total"."""
    import psutil

    out = {"api": 0, "children": 0}
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        out["api"] = root.memory_info().rss
        for process in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                out["children"] += process.memory_info().rss
    out["total"] = out["api"] + out["children"]
    return out


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


# Tracebacks vLLM 0.32 logs whatever the connector: at start, its chat template warm-up needs a
# tokenizer (a warning); at a clean shutdown, the API server's output handler reports the engine
# core it stopped as dead (EngineDeadError, also with no KV connector at all).
_STARTUP_TRACEBACK = "Chat template warmup failed"
_SHUTDOWN_STARTED = "[shutdown] API server: shutdown triggered"


def _expected_traceback(lines: list, i: int, shutdown_at: int) -> bool:
    if any(_STARTUP_TRACEBACK in lines[j] for j in range(max(0, i - 2), i)):
        return True
    return 0 <= shutdown_at < i and any("EngineDeadError" in lines[j]
                                        for j in range(i, min(len(lines), i + 12)))


def check_log(log: str, exit_code: Any, tally: Any) -> Dict[str, Any]:
    """The server's exit and log: SIGTERM exits 0, no traceback but vLLM's expected ones, no
    nanobind leak report, hsstore's shutdown lines."""
    lines = log.splitlines()
    shutdown_at = next((i for i, line in enumerate(lines) if _SHUTDOWN_STARTED in line), -1)
    tracebacks = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line
                  and not _expected_traceback(lines, i, shutdown_at)]
    leaks = [line for line in lines if "nanobind: leaked" in line]
    shutdown = [line[line.index("hsstore"):] for line in lines
                if "hsstore.vllm: shutdown:" in line or "hsstore.output_dir: closed:" in line]
    errors = [line for line in lines if re.search(r"\bERROR\b", line)]
    out = {"exit_code": exit_code, "tracebacks": len(tracebacks), "nanobind_leaks": len(leaks),
           "error_lines": len(errors), "shutdown_lines": shutdown,
           "recompute_lines": sum("recomputing from token" in line for line in lines),
           # vLLM 0.32's LMCacheConnectorV1 has no shutdown: LMCache's threads keep the worker
           # until vLLM kills it, after hsstore's shutdown has flushed (docs/reliability.md).
           "worker_killed_by_vllm": any("workers still running" in line for line in lines)}
    if exit_code != 0:
        tally.fail(f"the server exited {exit_code} on SIGTERM (0 expected)")
    for i in tracebacks[:3]:
        tally.fail("traceback in the server log:\n" + "\n".join(lines[i:i + 25]))
    if leaks:
        tally.fail(f"{len(leaks)} nanobind leak lines at exit: {leaks[:3]}")
    if not any("hsstore.output_dir: closed:" in line for line in shutdown):
        tally.fail("no 'hsstore.output_dir: closed' line: the writer was not closed on SIGTERM")
    return out


def misses_by_cause(final: Dict[str, float]) -> Dict[str, float]:
    """What the counters say about every prompt row not restored, by cause (hsstore's /metrics
    at the end of the run)."""
    names = {
        "kv_hit_capped_hidden_states_missing": "lookup_hits_capped_total",
        "kv_hit_tokens_capped": "lookup_tokens_capped_total",
        "rows_missing_at_step_recomputed": "recomputes_total",
        "tokens_recomputed": "tokens_recomputed_total",
        "evicted_pool_pressure": "store_hs_evictions_total",
        "dropped_kv_evicted": "store_coupled_evictions_total",
        "dropped_by_reset": "reset_keys_dropped_total",
        "remote_misses": "remote_misses_total",
        "remote_errors": "remote_errors_total",
        "remote_dropped_writes": "remote_dropped_writes_total",
        "store_miss_tokens": "store_miss_tokens_total",
    }
    return {cause: final.get(name, 0.0) for cause, name in names.items()}
