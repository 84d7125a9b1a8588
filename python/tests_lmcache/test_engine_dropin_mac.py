"""The drop-in's MAC key from LMCache's own config: hsstore keys LMCache has no attribute for
(hidden_state_mac_key_file, hidden_state_remote_url) are read from LMCacheEngineConfig's
extra_config, as ``"lmcache.extra_config": {...}`` in vLLM's kv_connector_extra_config sets it.
Two real LMCache 0.5.6 engines share hidden states through a throw-away redis-server: a value
written with another key, or with none (a forgery needs no key), is a counted miss, never served;
the same key is a hit."""

import shutil
import socket
import subprocess
import time

import pytest
import torch

import hsstore
import hsstore.lmcache
from test_engine_dropin import CHUNK, DIM, RealEngine

KEY_A = "hsstore-test-mac-key-A-0123456789"
KEY_B = "hsstore-test-mac-key-B-0123456789"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is missing (scripts/bootstrap installs it)")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path_factory.mktemp("redis"))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"*1\r\n$4\r\nPING\r\n")
                if s.recv(64).strip() == b"+PONG":
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.1)
    url = f"redis://127.0.0.1:{port}"
    probe = hsstore.Engine({"enable_hidden_state_cache": True, "max_hidden_state_cpu_size": 0.01,
                            "hidden_state_remote_url": url})
    remote = probe.hidden_state_store.stats()["remote"]["enabled"]
    del probe
    if remote is not True:
        proc.kill()
        proc.wait()
        pytest.skip("this hsstore build has no Redis tier (libhiredis-dev)")
    yield url
    proc.kill()
    proc.wait()


@pytest.fixture(autouse=True)
def dropin_installed():
    hsstore.lmcache.install()
    yield
    hsstore.lmcache.uninstall()


def key_file(tmp_path, name, key):
    path = tmp_path / name
    path.write_text(key + "\n")  # one trailing newline is not part of the key
    return str(path)


def engine_with(redis_url, instance, **extra):
    """A real engine whose hsstore settings come only from LMCache's extra_config."""
    extra = {"hidden_state_remote_url": redis_url, **extra}
    e = RealEngine(instance=instance, extra_config=extra)
    if e.store.stats()["remote"]["enabled"] is not True:  # the build has it (redis_url)
        e.close()
        pytest.fail("hidden_state_remote_url in LMCache's extra_config did not reach the store")
    return e


def write_prompt(engine, tokens, rows):
    engine.put_kv(engine.keys_for(tokens))
    assert engine.store.store_hidden_states(tokens, rows, layer_idx=-1) == len(tokens) // CHUNK
    deadline = time.monotonic() + 20
    while engine.store.stats()["remote"]["writes_sent"] < len(tokens) // CHUNK:
        assert time.monotonic() < deadline, "the write-behind did not reach Redis"
        time.sleep(0.05)


def read_prompt(engine, tokens):
    """KV present here, hidden states only in Redis: the retrieve reads them through."""
    engine.put_kv(engine.keys_for(tokens))
    return engine.store.retrieve_hidden_states(tokens, layer_idx=-1)


def test_mac_key_file_from_extra_config_reaches_the_native_store(tmp_path):
    path = key_file(tmp_path, "a.key", KEY_A)
    engine = RealEngine(extra_config={"hidden_state_mac_key_file": path})
    try:
        native = hsstore.lmcache._native_config(engine.config)
        assert native.hidden_state_mac_key_file == path
        assert native.chunk_size == CHUNK  # LMCache's attributes still come first
    finally:
        engine.close()
    # A bad key (too short, or both given) fails at configuration, naming the key.
    with pytest.raises(hsstore.ConfigError, match="hidden_state_mac_key"):
        RealEngine(extra_config={"hidden_state_mac_key": "short"})
    with pytest.raises(hsstore.ConfigError, match="at most one"):
        RealEngine(extra_config={"hidden_state_mac_key": KEY_A, "hidden_state_mac_key_file": path})


@pytest.mark.parametrize("writer_key", [KEY_B, None], ids=["other-key", "no-key"])
def test_value_written_with_another_key_is_a_counted_miss(redis_url, tmp_path, writer_key):
    reader_key = key_file(tmp_path, "reader.key", KEY_A)
    tokens = list(torch.randint(3, 30000, (4 * CHUNK,), generator=torch.Generator().manual_seed(
        1 if writer_key else 2)).tolist())
    rows = torch.randn(len(tokens), DIM)
    writer_extra = {}
    if writer_key is not None:
        writer_extra["hidden_state_mac_key_file"] = key_file(tmp_path, "writer.key", writer_key)
    writer = engine_with(redis_url, "writer", **writer_extra)
    try:
        write_prompt(writer, tokens, rows)
    finally:
        writer.close()

    reader = engine_with(redis_url, "reader", hidden_state_mac_key_file=reader_key)
    try:
        assert read_prompt(reader, tokens) is None  # not served
        remote = reader.store.stats()["remote"]
        assert remote["hits"] == 0 and remote["unauthenticated_values"] >= 1
        assert not reader.store.has_chunk(reader.keys_for(tokens)[0], -1)
    finally:
        reader.close()


def test_value_written_with_the_same_key_is_served(redis_url, tmp_path):
    tokens = list(range(1000, 1000 + 4 * CHUNK))
    rows = torch.randn(len(tokens), DIM)
    writer = engine_with(redis_url, "writer",
                         hidden_state_mac_key_file=key_file(tmp_path, "w.key", KEY_A))
    try:
        write_prompt(writer, tokens, rows)
    finally:
        writer.close()
    reader = engine_with(redis_url, "reader", hidden_state_mac_key=KEY_A)  # inline, same key
    try:
        got = read_prompt(reader, tokens)
        assert got is not None and torch.equal(got, rows)
        remote = reader.store.stats()["remote"]
        assert remote["hits"] >= 1 and remote["unauthenticated_values"] == 0
    finally:
        reader.close()
