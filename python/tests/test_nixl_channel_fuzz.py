"""A bounded mutation fuzzer of hsstore.nixl's control channel (the frames are parsed in Python,
so this is the channel's fuzzer; the C++ parser of the messages inside the frames has its libFuzzer
target, tests/fuzz/fuzz_transfer_wire.cpp). Seeded, a fixed number of cases: each mutates a
valid frame sequence (handshake, then PULL and RELEASE requests) with bit flips, truncations,
inserted and deleted bytes, wrong kinds and lengths, sends it through the real socket to a
producer over a real store (a fake NIXL agent: nixl_channel.py), and reads what comes back.

What must hold after every case: every frame the producer sent is well formed (HELLO, AUTH, PULL,
RELEASE or ERROR), metadata or an export went only to a connection that completed the handshake,
and the producer still serves a correct peer; at the end no lease is held and the store's
invariants hold."""

import random
import socket
import struct

import pytest

import nixl_channel as ch
from nixl_channel import AUTH, ERROR, HELLO, PULL, RELEASE

CASES = 400
SEED = 20261206


@pytest.fixture(autouse=True)
def fake_nixl(monkeypatch):
    ch.install_fake_nixl(monkeypatch)


def mutate(rng, data):
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        if op == 0 and data:  # flip a bit
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        elif op == 1 and data:  # truncate
            del data[rng.randrange(len(data)):]
        elif op == 2:  # insert bytes
            i = rng.randrange(len(data) + 1)
            data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 3 and data:  # delete a run
            i = rng.randrange(len(data))
            del data[i:i + rng.randint(1, 16)]
        else:  # a boundary value at a random offset
            i = rng.randrange(len(data) + 1)
            data[i:i + 4] = struct.pack("<I", rng.choice([0, 1, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF]))
    return bytes(data)


def frame(kind, payload):
    return ch.HEADER.pack(kind, len(payload)) + payload


def drain(sock):
    """Every frame the producer sends until it closes (or, at worst, goes quiet)."""
    sock.settimeout(10)
    frames = []
    while True:
        try:
            got = ch.recv(sock)
        except OSError:  # quiet (a timeout) or reset
            return frames
        if got is None:
            return frames
        frames.append(got)


def test_mutated_frame_sequences_get_well_formed_answers_and_leave_the_producer_serving():
    rng = random.Random(SEED)
    engine, agent, tokens = ch.producer()
    store = engine.hidden_state_store
    chunks = engine.token_database.process_tokens(tokens)
    repeated = [(i * ch.CHUNK, (i + 1) * ch.CHUNK, chunks[0][2]) for i in range(3)]
    requests = [ch.pull_request(chunks, [0, 1]), ch.pull_request(chunks[:2], [1]),
                ch.pull_request(repeated, [0]), struct.pack("<Q", 12345)]
    outcomes = {"authenticated": 0, "refused": 0}
    try:
        for case in range(CASES):
            with ch.connect(agent) as s:
                authenticate = rng.random() < 0.7
                if authenticate:
                    reply = ch.handshake(s)
                    assert reply is not None and reply[0] == AUTH
                    outcomes["authenticated"] += 1
                    kinds = [rng.choice([PULL, PULL, RELEASE, HELLO, AUTH, 0, 255])
                             for _ in range(rng.randint(1, 3))]
                    stream = b"".join(frame(k, rng.choice(requests)) for k in kinds)
                else:
                    stream = frame(HELLO, ch.MAGIC + bytes(32)) + frame(AUTH, bytes(32))
                try:
                    s.sendall(mutate(rng, stream))
                    s.shutdown(socket.SHUT_WR)  # the producer reads to the end, answers, closes
                except OSError:  # it closed already (a refusal): what it sent is still read
                    pass
                got = drain(s)
                for kind, payload in got:
                    assert kind in (HELLO, AUTH, PULL, RELEASE, ERROR), (case, kind)
                    if kind == AUTH:  # metadata only after a proof this test never forges
                        assert authenticate, case
                    if kind == PULL:
                        assert authenticate and payload[:4] == b"HSSE", case
                if not authenticate and any(k == ERROR for k, _ in got):
                    outcomes["refused"] += 1
            if case % 50 == 49:  # a correct peer is still served
                with ch.authenticated(agent) as s:
                    ch.send(s, PULL, requests[0])
                    kind, export = ch.recv(s)
                    assert kind == PULL
                    ch.send(s, RELEASE, struct.pack("<Q", ch.export_lease(export)))
                    assert ch.recv(s) == (RELEASE, b"\x01")
        # Every connection is closed: their leases end with them.
        assert ch.wait_for(lambda: store.stats()["transfer"]["leases_held"] == 0)
        assert ch.wait_for(lambda: agent._served == 0)
        store.check_invariants()
        assert outcomes["authenticated"] > CASES // 2 and outcomes["refused"] > 0, outcomes
        stats = agent.stats()
        assert stats["auth_failures"] >= outcomes["refused"]
    finally:
        agent.close()
