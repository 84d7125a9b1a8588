"""hsstore.nixl's control channel through its real socket, with a fake NIXL agent
(nixl_channel.py): who may get the producer's metadata and exports (peers that prove
hidden_state_mac_key), and what one peer may cost the producer (connections, idle time, the
deadline of an exchange, frame sizes, leases per connection, requests the store refuses).
docs/design.md, "Threat model"."""

import socket
import struct
import threading

import pytest

import hsstore
import hsstore.nixl

import nixl_channel as ch
from nixl_channel import AUTH, ERROR, HELLO, PULL, RELEASE


@pytest.fixture(autouse=True)
def fake_nixl(monkeypatch):
    ch.install_fake_nixl(monkeypatch)


@pytest.fixture
def served():
    made = []

    def make(**kw):
        engine, agent, tokens = ch.producer(**kw)
        made.append(agent)
        return engine, agent, tokens

    yield make
    for agent in made:
        agent.close()


def chunks_of(engine, tokens):
    return engine.token_database.process_tokens(tokens)


# ---- finding 2: peers authenticate before any metadata or address leaves the producer


def test_a_peer_that_sends_no_handshake_gets_one_error_frame_and_no_metadata(served):
    engine, agent, _ = served()
    with ch.connect(agent) as s:
        ch.send(s, HELLO, b"an-agent-name")  # what any peer sent before
        kind, body = ch.recv(s)
        assert kind == ERROR and body == b"authentication failed"
        assert ch.closed(s)
    assert agent.stats()["auth_failures"] == 1


def test_a_pull_before_the_handshake_gets_no_export(served):
    engine, agent, tokens = served()
    with ch.connect(agent) as s:
        ch.send(s, PULL, ch.pull_request(chunks_of(engine, tokens), [0]))
        assert ch.recv(s)[0] == ERROR
        assert ch.closed(s)
    assert engine.hidden_state_store.stats()["transfer"]["exports"] == 0
    assert agent.stats()["auth_failures"] == 1


def test_a_peer_with_another_key_is_refused_after_the_challenge(served):
    _, agent, _ = served()
    with ch.connect(agent) as s:
        reply = ch.handshake(s, key=ch.KEY + "-not-the-same")
        assert reply == (ERROR, b"authentication failed")
        assert ch.closed(s)
    assert agent.stats()["auth_failures"] == 1


def test_the_producer_proves_the_key_and_a_key_holder_gets_metadata_and_exports(served):
    engine, agent, tokens = served()
    with ch.connect(agent) as s:
        nonce_c = bytes(range(32))
        ch.send(s, HELLO, ch.MAGIC + nonce_c)
        kind, hello = ch.recv(s)
        nonce_s, proof = hello[6:38], hello[38:]
        assert kind == HELLO and hello[5] == 1
        assert proof == ch.tag(ch.KEY, "producer", nonce_c + nonce_s)
        ch.send(s, AUTH, ch.tag(ch.KEY, "consumer", nonce_c + nonce_s))
        kind, metadata = ch.recv(s)
        assert kind == AUTH and metadata == ch.METADATA + agent.name.encode()
        ch.send(s, PULL, ch.pull_request(chunks_of(engine, tokens), [0, 1]))
        kind, export = ch.recv(s)
        assert kind == PULL
        ch.send(s, RELEASE, struct.pack("<Q", ch.export_lease(export)))
        assert ch.recv(s) == (RELEASE, b"\x01")
    t = engine.hidden_state_store.stats()["transfer"]
    assert (t["exports"], t["exported_entries"], t["leases_released"]) == (1, 8, 1)
    assert agent.stats()["auth_failures"] == 0


def test_a_tag_replayed_on_a_new_connection_is_refused(served):
    _, agent, _ = served()
    with ch.connect(agent) as s:
        nonce_c = bytes(32)
        ch.send(s, HELLO, ch.MAGIC + nonce_c)
        _, hello = ch.recv(s)
        good = ch.tag(ch.KEY, "consumer", nonce_c + hello[6:38])
        ch.send(s, AUTH, good)
        assert ch.recv(s)[0] == AUTH
    with ch.connect(agent) as s:  # same nonce_c, a fresh nonce_s: the old tag is worthless
        ch.send(s, HELLO, ch.MAGIC + nonce_c)
        ch.recv(s)
        ch.send(s, AUTH, good)
        assert ch.recv(s) == (ERROR, b"authentication failed")
    assert agent.stats()["auth_failures"] == 1


def test_an_agent_without_a_key_is_a_config_error_unless_the_network_is_trusted(served):
    engine = hsstore.Engine(ch.config(hidden_state_mac_key=None))
    with pytest.raises(hsstore.ConfigError, match="hidden_state_transfer_trusted_network"):
        hsstore.nixl.NixlAgent(engine)
    _, agent, _ = served(hidden_state_mac_key=None, hidden_state_transfer_trusted_network=True)
    with ch.connect(agent) as s:
        kind, metadata = ch.handshake(s, key=None)
        assert kind == AUTH and metadata.startswith(ch.METADATA)


def test_a_keyed_peer_refuses_an_unkeyed_one(served):
    _, agent, _ = served()
    with ch.connect(agent) as s:  # an unkeyed consumer's empty tag
        ch.send(s, HELLO, ch.MAGIC + bytes(32))
        ch.recv(s)
        ch.send(s, AUTH, b"")
        assert ch.recv(s) == (ERROR, b"authentication failed")


def fake_producer(answer):
    """A listening socket whose one connection is handed to answer(sock) on a thread."""
    server = socket.create_server(("127.0.0.1", 0))
    address = "127.0.0.1:%d" % server.getsockname()[1]

    def run():
        conn, _ = server.accept()
        with conn:
            try:
                answer(conn)
            except OSError:
                pass
        server.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return address, thread


def consumer(**extra):
    engine = hsstore.Engine(ch.config(**extra))
    engine.hidden_state_store.bind_storage_manager(None)
    return engine, hsstore.nixl.NixlAgent(engine, serve=False)


def test_a_consumer_refuses_a_producer_that_cannot_prove_the_key():
    got_auth = []

    def impostor(conn):
        ch.recv(conn)
        ch.send(conn, HELLO, ch.MAGIC + b"\x01" + bytes(32) + bytes(32))  # a made-up proof
        got_auth.append(ch.recv(conn))

    address, thread = fake_producer(impostor)
    engine, agent = consumer()
    result = agent.pull(address, list(range(1, 2 * ch.CHUNK + 1)), [0], timeout=5)
    thread.join(30)
    assert "failed to prove" in result.missed
    assert got_auth == [None]  # the consumer closed without a proof of its own
    agent.close()


# ---- finding 3: what one peer may cost the producer


def test_a_pull_naming_one_key_many_times_is_refused_and_counted(served):
    engine, agent, tokens = served()
    key = chunks_of(engine, tokens)[0][2]
    repeated = [(i * ch.CHUNK, (i + 1) * ch.CHUNK, key) for i in range(64)]  # contiguous
    with ch.authenticated(agent) as s:
        ch.send(s, PULL, ch.pull_request(repeated, [0, 1]))
        kind, body = ch.recv(s)
        assert kind == ERROR and b"repeats the key" in body
        ch.send(s, PULL, ch.pull_request(chunks_of(engine, tokens), [0]))  # the connection lives
        assert ch.recv(s)[0] == PULL
    t = engine.hidden_state_store.stats()["transfer"]
    assert (t["refused_exports"], t["exports"]) == (1, 1)


def test_a_pull_over_max_chunks_is_refused(served):
    engine, agent, tokens = served(hidden_state_transfer_max_chunks=2)
    with ch.authenticated(agent) as s:
        ch.send(s, PULL, ch.pull_request(chunks_of(engine, tokens), [0]))
        kind, body = ch.recv(s)
        assert kind == ERROR and b"hidden_state_transfer_max_chunks" in body
    assert engine.hidden_state_store.stats()["transfer"]["refused_exports"] == 1


def test_a_connection_past_max_peers_gets_an_error_frame_and_is_closed(served):
    _, agent, _ = served(hidden_state_transfer_max_peers=2)
    held = [ch.authenticated(agent), ch.authenticated(agent)]
    with ch.connect(agent) as s:
        assert ch.recv(s) == (ERROR, b"too many control connections")
        assert ch.closed(s)
    assert agent.stats()["refused_connections"] == 1
    held.pop().close()  # a slot frees when a connection ends
    assert ch.wait_for(lambda: agent._served == 1)
    with ch.authenticated(agent):
        pass
    held.pop().close()


def test_an_idle_connection_is_closed(served):
    _, agent, _ = served(hidden_state_transfer_idle_ms=100)
    with ch.authenticated(agent) as s:
        assert ch.closed(s)
    assert agent.stats()["idle_closed"] == 1


def test_a_handshake_that_never_comes_is_cut_at_the_deadline(served):
    _, agent, _ = served(hidden_state_transfer_timeout_ms=200)
    with ch.connect(agent) as s:  # connects, sends nothing
        assert ch.recv(s) == (ERROR, b"authentication failed")
    assert agent.stats()["auth_failures"] == 1


def test_a_request_trickled_a_byte_at_a_time_is_cut_at_the_exchange_deadline(served):
    # Every byte arrives well inside the deadline of the one before: a per-read timeout never
    # fires. The exchange's deadline (timeout_ms from its first byte) does.
    engine, agent, tokens = served(hidden_state_transfer_timeout_ms=300,
                                   hidden_state_transfer_idle_ms=60000)
    request = ch.pull_request(chunks_of(engine, tokens), [0])
    frame = ch.HEADER.pack(PULL, len(request)) + request
    stop = threading.Event()
    with ch.authenticated(agent) as s:
        def trickle():
            for byte in frame:
                if stop.wait(0.05):
                    return
                try:
                    s.send(bytes([byte]))
                except OSError:
                    return

        thread = threading.Thread(target=trickle, daemon=True)
        thread.start()
        try:
            assert ch.closed(s)  # long before the ~len(frame) * 50 ms it would take
        finally:
            stop.set()
            thread.join(30)
    assert agent.stats()["deadline_closed"] == 1
    assert engine.hidden_state_store.stats()["transfer"]["exports"] == 0


def test_a_frame_longer_than_the_handshake_allows_is_refused_unread(served):
    _, agent, _ = served()
    with ch.connect(agent) as s:
        s.sendall(ch.HEADER.pack(HELLO, 200 << 20))  # claims 200 MiB; sends none of it
        assert ch.recv(s) == (ERROR, b"authentication failed")
        assert ch.closed(s)


def test_a_request_frame_over_the_chunk_bound_is_refused_unread(served):
    _, agent, _ = served(hidden_state_transfer_max_chunks=16)
    with ch.authenticated(agent) as s:
        s.sendall(ch.HEADER.pack(PULL, 64 << 20))
        assert ch.recv(s) == (ERROR, b"request frame over the limit")
        assert ch.closed(s)


def test_a_lease_of_another_connection_cannot_be_released(served):
    engine, agent, tokens = served()
    with ch.authenticated(agent) as a, ch.authenticated(agent) as b:
        ch.send(a, PULL, ch.pull_request(chunks_of(engine, tokens), [0]))
        lease = ch.export_lease(ch.recv(a)[1])
        ch.send(b, RELEASE, struct.pack("<Q", lease))
        assert ch.recv(b) == (RELEASE, b"\x00")
        assert engine.hidden_state_store.stats()["transfer"]["leases_held"] == 1
        ch.send(a, RELEASE, struct.pack("<Q", lease))
        assert ch.recv(a) == (RELEASE, b"\x01")
    assert agent.stats()["refused_releases"] == 1


def test_leases_past_peer_leases_are_refused_until_one_is_released(served):
    engine, agent, tokens = served(hidden_state_transfer_peer_leases=2)
    request = ch.pull_request(chunks_of(engine, tokens), [0])
    with ch.authenticated(agent) as s:
        leases = []
        for _ in range(2):
            ch.send(s, PULL, request)
            leases.append(ch.export_lease(ch.recv(s)[1]))
        ch.send(s, PULL, request)
        kind, body = ch.recv(s)
        assert kind == ERROR and b"hidden_state_transfer_peer_leases" in body
        ch.send(s, RELEASE, struct.pack("<Q", leases[0]))
        assert ch.recv(s) == (RELEASE, b"\x01")
        ch.send(s, PULL, request)
        assert ch.recv(s)[0] == PULL
    assert agent.stats()["refused_pulls"] == 1


def test_leases_past_peer_leased_bytes_are_refused_and_pin_nothing(served):
    entry = ch.CHUNK * ch.COLS * 4
    engine, agent, tokens = served(hidden_state_transfer_peer_leased_bytes=6 * entry)
    request = ch.pull_request(chunks_of(engine, tokens), [0])  # 4 entries
    with ch.authenticated(agent) as s:
        ch.send(s, PULL, request)
        assert ch.recv(s)[0] == PULL
        ch.send(s, PULL, request)
        kind, body = ch.recv(s)
        assert kind == ERROR and b"hidden_state_transfer_peer_leased_bytes" in body
        assert engine.hidden_state_store.stats()["transfer"]["leases_held"] == 1
    assert agent.stats()["refused_pulls"] == 1


def test_a_closed_connection_s_leases_end(served):
    engine, agent, tokens = served()
    with ch.authenticated(agent) as s:
        ch.send(s, PULL, ch.pull_request(chunks_of(engine, tokens), [0, 1]))
        assert ch.recv(s)[0] == PULL
        assert engine.hidden_state_store.stats()["transfer"]["leases_held"] == 1
    assert ch.wait_for(lambda: engine.hidden_state_store.stats()["transfer"]["leases_held"] == 0)


def test_a_producer_trickling_its_reply_costs_the_consumer_at_most_its_timeout():
    # The consumer's bound is the whole exchange, not each read: a producer that proves the key
    # and then answers a PULL a byte every 50 ms (each read well inside any per-read timeout)
    # is given up on at the pull's deadline.
    stop = threading.Event()

    def slow_producer(conn):
        _, hello = ch.recv(conn)
        nonce_c, nonce_s = hello[5:], bytes(range(32))
        ch.send(conn, HELLO, ch.MAGIC + b"\x01" + nonce_s + ch.tag(ch.KEY, "producer", nonce_c + nonce_s))
        ch.recv(conn)
        ch.send(conn, AUTH, ch.METADATA + b"slow")
        ch.recv(conn)  # the PULL
        conn.sendall(ch.HEADER.pack(PULL, 100000))
        while not stop.wait(0.05):
            conn.sendall(b"\x00")

    address, thread = fake_producer(slow_producer)
    engine, agent = consumer()
    done = []
    puller = threading.Thread(target=lambda: done.append(
        agent.pull(address, list(range(1, 2 * ch.CHUNK + 1)), [0], timeout=1.0)), daemon=True)
    puller.start()
    puller.join(30)  # liveness, not speed: without the exchange deadline this takes ~5000 s
    stop.set()
    thread.join(30)
    assert done and done[0].missed is not None and "deadline" in done[0].missed
    agent.close()
