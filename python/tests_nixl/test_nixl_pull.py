"""Prefill/decode transfer over NIXL between real processes (hsstore.nixl): round trip, leases
against the producer's eviction, a producer killed mid-transfer, corrupted and unauthenticated
granules, an expired lease, a full consumer pool, KV gaps, and two consumers at once."""

import hashlib
import hmac
import os
import signal
import socket
import struct
import time

import pytest

from conftest import CHUNK, SHARED_KEY, config

TOKENS = 4096
COLS = 256
LAYERS = [-1, 0, 5]
ENTRY_BYTES = CHUNK * COLS * 4
KEY = SHARED_KEY


def store(producer, seed=1, n=TOKENS, layers=LAYERS, cols=COLS, **extra):
    return producer.send(cmd="store", seed=seed, n=n, layers=layers, cols=cols, **extra)


def pull(consumer, producer, seed=1, n=TOKENS, layers=LAYERS, **extra):
    return consumer.send(cmd="pull", address=producer.address, seed=seed, n=n, layers=layers,
                         cols=COLS, **extra)


def test_round_trip_three_layers_of_a_4096_token_prompt_bit_for_bit(peers):
    producer, consumer = peers(("producer", config(64)), ("consumer", config(64)))
    store(producer)
    r = pull(consumer, producer)
    assert r["result"]["missed"] is None
    assert r["result"]["chunks_pulled"] == TOKENS // CHUNK
    assert r["result"]["entries_published"] == 3 * TOKENS // CHUNK
    assert r["result"]["bytes"] == 3 * TOKENS * COLS * 4
    assert r["rows"] == TOKENS and r["equal"]
    assert r["stats"]["transfer"]["imported_entries"] == 48
    p = producer.send(cmd="stats")["stats"]["transfer"]
    assert p["leases_held"] == 0 and p["leases_released"] == 1 and p["exported_entries"] == 48
    # Everything is local now: a second pull moves nothing.
    again = pull(consumer, producer)
    assert again["result"]["chunks_wanted"] == 0 and again["rows"] == TOKENS


def test_only_chunks_with_kv_on_the_consumer_are_pulled(peers):
    producer, consumer = peers(("producer", config(64)), ("consumer", config(64)))
    store(producer)
    r = pull(consumer, producer, kv_gone=[6])
    assert r["result"]["chunks_wanted"] == 6
    assert r["rows"] == 6 * CHUNK and r["equal"]
    assert r["stats"]["transfer"]["imported_entries"] == 18


def test_leased_granules_survive_producer_pool_pressure_and_are_reused_after_release(peers):
    # The producer's pool holds 16 entries of 256 x 256 float32; the leased prompt takes 12.
    producer, consumer = peers(("producer", config(4)), ("consumer", config(64)))
    store(producer, seed=1, n=4 * CHUNK, layers=[0, 1, 2])
    consumer.write(cmd="pull", address=producer.address, seed=1, n=4 * CHUNK, layers=[0, 1, 2],
                   cols=COLS, pause_after_lease=True)
    assert consumer.read()["event"] == "leased"
    leased = producer.send(cmd="stats")["stats"]["transfer"]
    assert leased["leases_held"] == 1 and leased["leased_bytes"] == 12 * ENTRY_BYTES
    # Pressure: a 6-chunk prompt needs 6 entries; 4 are free and the leased key is never evicted.
    s = store(producer, seed=11, n=6 * CHUNK, layers=[0])["stats"]
    assert s["allocation_failures"] == 1 and s["hs_evictions"] == 0
    assert all(producer.send(cmd="has", seed=1, n=4 * CHUNK, layer=0)["has"])
    consumer.write(cmd="go")
    r = consumer.read()
    assert r["result"]["missed"] is None and r["rows"] == 4 * CHUNK and r["equal"]
    # Released: the same pressure now evicts the prompt and reuses its granules.
    assert producer.send(cmd="stats")["stats"]["transfer"]["leases_held"] == 0
    for seed in (21, 22, 23):
        store(producer, seed=seed, n=6 * CHUNK, layers=[0])
    assert not any(producer.send(cmd="has", seed=1, n=4 * CHUNK, layer=0)["has"])
    assert producer.send(cmd="stats")["stats"]["hs_evictions"] >= 4


def test_producer_killed_mid_transfer_is_a_bounded_clean_miss(peers):
    producer, consumer = peers(("producer", config(160)), ("consumer", config(160)))
    store(producer, n=16384, layers=[0, 1])  # 32 MiB per layer: the READ takes a while
    r = pull(consumer, producer, n=16384, layers=[0, 1], kill_after_post=producer.pid, timeout=5)
    producer.proc.wait(timeout=10)
    assert r["result"]["missed"] is not None
    assert r["entries"] == 0 and r["rows"] == 0  # nothing half-published
    assert r["stats"]["transfer"]["imported_entries"] == 0
    assert r["stats"]["pool_free_bytes"] == r["stats"]["pool_capacity_bytes"]
    assert r["elapsed"] < 5 + 2  # bounded by the timeout
    assert r["agent"]["missed_pulls"] == 1


def test_a_read_outliving_its_timeout_never_lands_in_granules_reused_since(peers):
    # The producer hangs (SIGSTOP) with the READ posted: the pull times out. Whatever NIXL says
    # about cancelling it, the READ may still land when the producer resumes, so its granules
    # must not hold anything else until it is known to be over (the P/D soak served another
    # prompt's rows from such granules: docs/reliability.md, "The soak").
    producer, consumer = peers(("producer", config(160)),
                               ("consumer", config(80, hidden_state_transfer_timeout_ms=1500)))
    store(producer, n=16384, layers=[0, 1])  # 32 MiB per layer: the READ takes a while
    r = pull(consumer, producer, n=16384, layers=[0, 1], stop_after_post=producer.pid)
    try:
        assert r["result"]["missed"] is not None and r["rows"] == 0
        # The consumer's pool is then filled with a prompt of its own, in any granule it may use.
        filled = consumer.send(cmd="store", seed=2, n=16384, layers=[0, 1], cols=COLS)
        assert "error" not in filled
    finally:
        os.kill(producer.pid, signal.SIGCONT)
    time.sleep(3)  # a late READ lands now, if it can
    own = consumer.send(cmd="check", seed=2, n=16384, layers=[0, 1], cols=COLS)
    assert own["rows"] > 0 and own["equal"], own
    # Once the READ is over, its granules go back to the pool: a later pull cleans up.
    again = pull(consumer, producer, n=CHUNK, layers=[0, 1], seed=1)
    assert again["agent"]["stuck_transfers"] == 0


def test_corrupted_granule_is_a_counted_miss_and_the_prefix_stops_before_it(peers):
    producer, consumer = peers(("producer", config(64)), ("consumer", config(64)))
    store(producer)
    r = pull(consumer, producer, corrupt_at=(5 * len(LAYERS) + 1) * ENTRY_BYTES + 100)
    assert r["result"]["entries_rejected"] == 1
    assert r["stats"]["transfer"]["rejected_entries"] == 1
    assert r["rows"] == 5 * CHUNK and r["equal"]  # chunk 5 misses one layer: the prefix ends there


def test_a_consumer_with_another_key_is_refused_before_any_export(peers):
    # The values' MAC is checked on publish (tests/transfer); a peer without the key never gets
    # that far: the handshake refuses it before the producer's metadata or any address leaves.
    producer, keyed, other = peers(
        ("producer", config(64, hidden_state_mac_key=KEY)),
        ("consumer", config(64, hidden_state_mac_key=KEY)),
        ("consumer", config(64, hidden_state_mac_key=KEY + "-not-the-same")),
    )
    store(producer)
    ok = pull(keyed, producer)
    assert ok["result"]["missed"] is None and ok["rows"] == TOKENS and ok["equal"]
    bad = pull(other, producer)
    assert bad["rows"] == 0 and "failed to prove" in bad["result"]["missed"]
    p = producer.send(cmd="stats")
    assert p["stats"]["transfer"]["exports"] == 1  # the key holder's only
    # The consumer hung up on the producer's proof; the producer's connection thread counts the
    # failure when it reads that close, which may come after this process asked: wait for it.
    deadline = time.monotonic() + 30
    while p["agent"]["auth_failures"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
        p = producer.send(cmd="stats")
    assert p["agent"]["auth_failures"] == 1
    assert p["stats"]["transfer"]["exports"] == 1


def test_an_unkeyed_pair_runs_only_on_a_trusted_network(peers):
    trusted = dict(hidden_state_mac_key=None, hidden_state_transfer_trusted_network=True)
    producer, consumer = peers(("producer", config(64, **trusted)), ("consumer", config(64, **trusted)))
    store(producer)
    r = pull(consumer, producer)
    assert r["result"]["missed"] is None and r["rows"] == TOKENS and r["equal"]


def test_expired_lease_is_a_miss(peers):
    producer, consumer = peers(("producer", config(64, hidden_state_transfer_lease_ms=50)),
                               ("consumer", config(64)))
    store(producer)
    r = pull(consumer, producer, sleep_after_lease=0.3)
    assert r["result"]["missed"] == "lease expired"
    assert r["rows"] == 0 and r["entries"] == 0
    assert r["stats"]["transfer"]["abandoned_entries"] == 48
    assert producer.send(cmd="stats")["stats"]["transfer"]["leases_expired"] == 1


def test_full_consumer_pool_is_a_clean_partial_prefix(peers):
    producer, consumer = peers(("producer", config(64)), ("consumer", config(5 * 3 * 0.25 + 0.1)))
    store(producer)
    r = pull(consumer, producer)
    assert r["result"]["chunks_pulled"] == 5
    assert r["rows"] == 5 * CHUNK and r["equal"]
    assert r["result"]["missed"] is not None


def test_two_consumers_pull_the_same_prefix_at_once(peers):
    producer, a, b = peers(("producer", config(64)), ("consumer", config(64)), ("consumer", config(64)))
    store(producer)
    for c in (a, b):
        c.write(cmd="pull", address=producer.address, seed=1, n=TOKENS, layers=LAYERS, cols=COLS)
    ra, rb = a.read(), b.read()
    for r in (ra, rb):
        assert r["result"]["missed"] is None and r["rows"] == TOKENS and r["equal"]
    p = producer.send(cmd="stats")["stats"]["transfer"]
    assert p["exports"] == 2 and p["leases_released"] == 2 and p["leases_held"] == 0


def authenticated_socket(address):
    """A control connection that has done the handshake with the shared key (by hand)."""
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    nonce_c = os.urandom(32)
    s.sendall(struct.pack("<BI", 1, 37) + b"HSSA\x01" + nonce_c)
    kind, length = struct.unpack("<BI", s.recv(5, socket.MSG_WAITALL))
    hello = s.recv(length, socket.MSG_WAITALL)
    name = b"hss:peer-auth:v1:consumer"
    proof = hmac.new(KEY.encode(), struct.pack("<I", len(name)) + name + nonce_c + hello[6:38],
                     hashlib.sha256).digest()
    s.sendall(struct.pack("<BI", 5, len(proof)) + proof)
    kind, length = struct.unpack("<BI", s.recv(5, socket.MSG_WAITALL))
    s.recv(length, socket.MSG_WAITALL)
    assert kind == 5, "the handshake failed"
    return s


def test_malformed_control_messages_get_an_error_and_the_producer_keeps_serving(peers):
    producer, consumer = peers(("producer", config(64)), ("consumer", config(64)))
    store(producer)
    with authenticated_socket(producer.address) as s:
        for payload in (b"", b"HSSQ", b"HSSQ\x01\x00\x00\x00" + b"\xff" * 40, b"junk" * 100):
            s.sendall(struct.pack("<BI", 2, len(payload)) + payload)
            kind, length = struct.unpack("<BI", s.recv(5, socket.MSG_WAITALL))
            body = s.recv(length, socket.MSG_WAITALL)
            assert kind == 4 and b"transfer message" in body
        s.sendall(struct.pack("<BI", 3, 8) + struct.pack("<Q", 12345))  # an unknown lease
        kind, length = struct.unpack("<BI", s.recv(5, socket.MSG_WAITALL))
        assert kind == 3 and s.recv(length, socket.MSG_WAITALL) == b"\x00"
    r = pull(consumer, producer)
    assert r["rows"] == TOKENS and r["equal"]
    assert producer.send(cmd="stats")["agent"]["serve_errors"] == 4


def test_a_restarted_producer_is_reached_again_on_the_next_pull(peers):
    producer, consumer = peers(("producer", config(64, hidden_state_transfer_listen="127.0.0.1:0")),
                               ("consumer", config(64)))
    store(producer, n=2 * CHUNK)
    assert pull(consumer, producer, n=2 * CHUNK)["rows"] == 2 * CHUNK
    address = producer.address
    producer.close()  # gone: its agent, pool and socket
    dead = consumer.send(cmd="pull", address=address, seed=2, n=2 * CHUNK, layers=LAYERS, cols=COLS)
    assert dead["result"]["missed"].startswith("producer failed") and dead["rows"] == 0
    port = int(address.rsplit(":", 1)[1])
    (again,) = peers(("producer", config(64, hidden_state_transfer_listen=f"127.0.0.1:{port}")))
    store(again, seed=3, n=2 * CHUNK)
    r = consumer.send(cmd="pull", address=again.address, seed=3, n=2 * CHUNK, layers=LAYERS, cols=COLS)
    assert r["result"]["missed"] is None and r["rows"] == 2 * CHUNK and r["equal"]
    # Restarted again, unnoticed: the cached connection fails on first use and is replaced.
    again.close()
    (third,) = peers(("producer", config(64, hidden_state_transfer_listen=f"127.0.0.1:{port}")))
    store(third, seed=4, n=2 * CHUNK)
    r = consumer.send(cmd="pull", address=third.address, seed=4, n=2 * CHUNK, layers=LAYERS, cols=COLS)
    assert r["result"]["missed"] is None and r["rows"] == 2 * CHUNK and r["equal"]
    assert r["agent"]["peer_failures"] == 1


def test_a_pull_under_one_cache_salt_never_gets_another_s_hidden_states(peers):
    # hsstore.vllm keys a salted request's hidden states with its cache_salt (hsstore.salt); the
    # key travels on the wire, so a decode engine asking for one tenant's chunks is answered
    # with that tenant's only: another salt, or none, pulls nothing.
    producer, consumer = peers(("producer", config(64)), ("consumer", config(64)))
    store(producer, n=4 * CHUNK, salt="tenant-1")
    for salt in ("tenant-2", None):
        r = pull(consumer, producer, n=4 * CHUNK, salt=salt)
        assert r["result"]["chunks_wanted"] == 4 and r["result"]["chunks_pulled"] == 0
        assert r["rows"] == 0 and r["stats"]["transfer"]["imported_entries"] == 0
    r = pull(consumer, producer, n=4 * CHUNK, salt="tenant-1")
    assert r["result"]["missed"] is None and r["result"]["chunks_pulled"] == 4
    assert r["rows"] == 4 * CHUNK and r["equal"]
    # Pulled under tenant 1's keys only: the consumer has nothing under another salt or none.
    for salt in ("tenant-2", None):
        assert consumer.send(cmd="check", seed=1, n=4 * CHUNK, layers=LAYERS, cols=COLS,
                             salt=salt)["rows"] == 0
