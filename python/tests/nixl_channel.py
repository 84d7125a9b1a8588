"""Test helpers for hsstore.nixl's control channel without NIXL: a fake ``nixl`` package (an agent
that registers nothing and hands out fixed metadata), a producer NixlAgent over a real store and
its real socket, and a client that speaks the channel's frames by hand, with its own HMAC of the
handshake (Python's hmac: an implementation independent of the store's).

The fake stands in only for NIXL's agent: the control socket, the handshake, the PULL/RELEASE
serving and the store's exports are the real ones. The READ itself needs NIXL
(python/tests_nixl)."""

import hashlib
import hmac
import importlib.machinery
import os
import socket
import struct
import sys
import time
import types

import hsstore
import hsstore.nixl

CHUNK = 16
COLS = 8
KEY = "channel-test-shared-key-0123456789"
HEADER = struct.Struct("<BI")
HELLO, PULL, RELEASE, ERROR, AUTH = 1, 2, 3, 4, 5
MAGIC = b"HSSA\x01"
METADATA = b"fake-nixl-metadata:"


class FakeNixlAgent:
    def __init__(self, name, _config):
        self.name = name
        self.backends = ["UCX"]
        self.plugin_list = ["UCX"]

    def register_memory(self, regions, _kind, backends=None):
        return list(regions)

    def deregister_memory(self, _registered, backends=None):
        pass

    def get_agent_metadata(self):
        return METADATA + self.name.encode()

    def add_remote_agent(self, metadata):
        assert metadata.startswith(METADATA), metadata
        return metadata[len(METADATA):].decode()

    def remove_remote_agent(self, _name):
        pass


def install_fake_nixl(monkeypatch):
    """sys.modules gets a ``nixl`` package (with a spec, so Config's find_spec sees one) whose
    ``nixl._api`` has the fake agent."""
    package = types.ModuleType("nixl")
    package.__spec__ = importlib.machinery.ModuleSpec("nixl", None, is_package=True)
    package.__path__ = []
    api = types.ModuleType("nixl._api")
    api.__spec__ = importlib.machinery.ModuleSpec("nixl._api", None)
    api.nixl_agent = FakeNixlAgent
    api.nixl_agent_config = lambda backends, enable_listen_thread: {"backends": backends}
    package._api = api
    monkeypatch.setitem(sys.modules, "nixl", package)
    monkeypatch.setitem(sys.modules, "nixl._api", api)


def config(**extra):
    c = {
        "chunk_size": CHUNK,
        "enable_hidden_state_cache": True,
        "max_hidden_state_cpu_size": 0.01,
        "hidden_state_transfer": "nixl",
        "hidden_state_transfer_timeout_ms": 5000,
        "hidden_state_mac_key": KEY,
    }
    c.update(extra)
    return {k: v for k, v in c.items() if v is not None}


def rows(n, layer=0):
    import numpy as np

    return np.arange(n * COLS, dtype=np.float32).reshape(n, COLS) + 1000.0 * layer


def producer(chunks=4, layers=(0, 1), **extra):
    """(engine, agent, tokens): an engine holding `chunks` chunks of `layers`, serving."""
    engine = hsstore.Engine(config(**extra))
    store = engine.hidden_state_store
    store.bind_storage_manager(None)  # KV present for every chunk
    tokens = list(range(1, chunks * CHUNK + 1))
    for layer in layers:
        store.store_hidden_states(tokens, rows(len(tokens), layer), layer_idx=layer)
    agent = hsstore.nixl.NixlAgent(engine)
    return engine, agent, tokens


def tag(key, side, transcript):
    """T(side) of the handshake (hsstore/nixl.py's docstring): the value MAC's construction with
    an empty header, over the name "hss:peer-auth:v1:<side>"."""
    name = b"hss:peer-auth:v1:" + side.encode()
    return hmac.new(key.encode(), struct.pack("<I", len(name)) + name + transcript,
                    hashlib.sha256).digest()


def send(sock, kind, payload):
    sock.sendall(HEADER.pack(kind, len(payload)) + payload)


def recv(sock):
    """(kind, payload), or None when the producer closed the connection."""
    head = b""
    while len(head) < HEADER.size:
        try:
            part = sock.recv(HEADER.size - len(head))
        except ConnectionResetError:
            return None
        if not part:
            return None
        head += part
    kind, length = HEADER.unpack(head)
    body = b""
    while len(body) < length:
        part = sock.recv(length - len(body))
        if not part:
            return None
        body += part
    return kind, body


def closed(sock, timeout=30):
    """True when the producer closes `sock` (EOF or reset) within `timeout` seconds."""
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def connect(agent):
    host, port = agent.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.settimeout(30)
    return sock


def handshake(sock, key=KEY):
    """The consumer's side with `key` (None: an unkeyed, trusted-network peer): the producer's
    AUTH reply (kind, payload), or its ERROR, or None when it closed."""
    nonce_c = os.urandom(32)
    send(sock, HELLO, MAGIC + nonce_c)
    kind, hello = recv(sock)
    assert kind == HELLO and hello.startswith(MAGIC), (kind, hello)
    nonce_s, proof = hello[len(MAGIC) + 1:len(MAGIC) + 33], hello[len(MAGIC) + 33:]
    transcript = nonce_c + nonce_s
    if key is not None:
        assert hello[len(MAGIC)] == 1
        assert proof == tag(key, "producer", transcript) or key != KEY
        send(sock, AUTH, tag(key, "consumer", transcript))
    else:
        assert hello[len(MAGIC)] == 0 and proof == b""
        send(sock, AUTH, b"")
    return recv(sock)


def authenticated(agent):
    sock = connect(agent)
    reply = handshake(sock)
    assert reply is not None and reply[0] == AUTH and reply[1].startswith(METADATA), reply
    return sock


def wire_str(text):
    data = text.encode()
    return struct.pack("<H", len(data)) + data


def pull_request(chunks, layers, first=0):
    """An HSSQ pull request (hss/transfer_wire.hpp) for (start, end, key) chunks and hidden-state
    layers, written here by hand so a test can say what a real consumer never would."""
    out = b"HSSQ" + struct.pack("<HHIII", 1, 0, first, 0, len(chunks))
    for start, end, key in chunks:
        out += struct.pack("<qq", start, end)
        out += wire_str(key.fmt) + wire_str(key.model_name) + wire_str(key.kv_dtype)
        out += struct.pack("<qqQ", key.world_size, key.worker_id, key.chunk_hash)
    out += struct.pack("<I", len(layers))
    for layer in layers:
        out += struct.pack("<Bq", 0, layer)  # kind 0: hidden
    return out


def export_lease(export):
    """The lease id of an HSSE export."""
    assert export[:4] == b"HSSE", export[:16]
    return struct.unpack_from("<Q", export, 8)[0]


def wait_for(predicate, timeout=30):
    """True once predicate() holds (polled), False after `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
