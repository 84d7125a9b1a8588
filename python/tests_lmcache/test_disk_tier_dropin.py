"""The disk tier through the drop-in inside a real LMCache 0.5.6 engine configured with
LMCache's own `local_disk` keys: values written behind are on disk once the engine is closed, and
another process's engine on the same directory serves them bit-exact from disk (a promotion into
its empty pool), its stats counting the disk hits; its coverage counts them only when asked to
include the tiers. Each process also ends without a nanobind
"leaked" line although the closed engine stays reachable from a thread until exit."""

import pathlib
import subprocess
import sys
import textwrap

WRITER = textwrap.dedent(
    """
    import sys, threading, time
    import torch
    from unittest.mock import MagicMock
    import hsstore
    import hsstore.lmcache
    from lmcache.v1.cache_engine import LMCacheEngine
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.gpu_connector import GPUConnectorInterface
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.token_database import ChunkedTokenDatabase

    disk, mode = sys.argv[1], sys.argv[2]
    hsstore.lmcache.install()
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=8, local_cpu=True, max_local_cpu_size=0.05, local_disk=disk,
        max_local_disk_size=0.05, remote_url=None, save_unfull_chunk=False,
        enable_hidden_state_cache=True, max_hidden_state_cpu_size=0.05,
        enable_async_loading=False, use_layerwise=False, lmcache_instance_id="exit_" + mode)
    metadata = LMCacheMetadata(
        model_name="test_model", world_size=1, local_world_size=1, worker_id=0,
        local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=(1, 2, 8, 1, 16), chunk_size=8)
    db = ChunkedTokenDatabase(config, metadata)
    engine = LMCacheEngine(config, metadata, db, MagicMock(spec=GPUConnectorInterface),
                           MagicMock(), MagicMock())
    engine.post_init()
    store = engine.hidden_state_store
    assert type(store) is hsstore.lmcache.HiddenStateStore, type(store)
    store.bind_storage_manager(None)  # KV counts as present: the disk tier alone is looked at
    tokens = list(range(100, 164))  # 8 chunks
    rows = torch.arange(64 * 16, dtype=torch.float32).reshape(64, 16) / 7.0
    if mode == "write":
        assert store.store_hidden_states(tokens, rows) == 8
        # What vLLM and LMCache do: the engine is closed (which closes the store), yet stays
        # reachable from a thread that never stops (LMCache's lookup server) until exit.
        threading.Thread(target=lambda e=engine: time.sleep(3600), daemon=True).start()
        engine.close()
        print("stored", flush=True)
    else:
        # The pool is empty; the disk holds every chunk. What vLLM's cap asks counts the tiers
        # (hsstore.vllm.stores); the pool alone covers nothing.
        chunks = store.chunks(tokens)
        assert store.coverage(chunks, [0]) == 0
        tiered = store.coverage(chunks, [0], scope=hsstore.CoverageScope.local_and_remote)
        assert tiered == 64, tiered
        got = store.retrieve_hidden_states(tokens)
        assert got is not None and torch.equal(got, rows), got
        tiers = {t["name"]: t for t in store.stats()["tiers"]}
        assert tiers["disk"]["hits"] == 8, tiers
        engine.close()
        print("read back", flush=True)
    """
)


def run(disk: pathlib.Path, mode: str, script: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), str(disk), mode], capture_output=True,
                          text=True, timeout=120)


def test_values_written_behind_to_disk_are_served_bit_exact_by_the_next_process(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    disk = tmp_path / "disk"

    wrote = run(disk, "write", script)
    assert wrote.returncode == 0, wrote.stderr[-4000:]
    assert "stored" in wrote.stdout
    assert "nanobind: leaked" not in wrote.stderr, wrote.stderr[-4000:]
    assert len(list((disk / "hsstore").glob("*.hsv"))) == 8

    read = run(disk, "read", script)
    assert read.returncode == 0, read.stderr[-4000:]
    assert "read back" in read.stdout
    assert "nanobind: leaked" not in read.stderr, read.stderr[-4000:]
