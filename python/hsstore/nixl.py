"""hsstore.nixl: prefill and decode on different hosts, hidden states pulled one-sided over NIXL.

The producer (a prefill worker) keeps its hidden states in its pinned pool as usual. The consumer
(a decode worker) asks it for a prompt's chunks, gets their descriptors and a lease in one small
control message, READs the granules straight into granules it reserved in its own pool, confirms
the lease, and publishes them after checking them against the producer's header (xxHash3) and,
with ``hidden_state_mac_key``, its MAC. Then an ordinary retrieve serves them::

    # both processes: create every process first, then one agent each (NIXL's rule)
    engine = hsstore.Engine(config)          # hidden_state_transfer: nixl
    agent = hsstore.nixl.NixlAgent(engine)   # registers the pool once; serves pulls
    # producer: store as usual, then tell the consumer agent.address
    # consumer, once the prompt's KV has arrived:
    result = agent.pull(producer_address, token_ids, layers=[0, 5, -1])
    engine.hidden_state_store.retrieve_layers(token_ids, [0, 5, -1])

Rules (docs/design.md, "Point-to-point transfer"): KV presence on the consumer decides which
chunks are worth pulling; a chunk whose lease expired, whose bytes fail the check, or that the
consumer's pool cannot hold is a counted miss, never served; a producer that dies or hangs
mid-transfer costs the consumer at most ``hidden_state_transfer_timeout_ms`` and leaves nothing
half-published. A READ that cannot be cancelled keeps its destination granules reserved until it
can, so no granule a NIC may still write is ever handed out again.

Control plane: one TCP connection per (consumer, producer) pair, length-prefixed frames carrying
the C++ wire format (hss/transfer_wire.hpp). A socket gives a hard deadline on every exchange and
sees a dead peer at once (a reset), and needs nothing beside NIXL; NIXL notifications would need a
progress loop on the producer, and the Redis tier as a directory would put a third party on the
latency path of every pull.

Who may use the channel (docs/design.md, "Threat model"): a peer proves it holds
``hidden_state_mac_key`` before anything leaves the producer. The handshake::

    consumer -> HELLO  "HSSA" 1 | nonce_c (32 random bytes)
    producer -> HELLO  "HSSA" 1 | keyed (u8) | nonce_s (32) | tag_p = T("producer")
    consumer -> AUTH   tag_c = T("consumer")
    producer -> AUTH   the agent's NIXL metadata            (or ERROR, and the connection closed)

    T(side) = HMAC-SHA256(key, u32le(len(n)) || n || nonce_c || nonce_s), n = "hss:peer-auth:v1:" side

(PoolTransfer.handshake_tag: the key never leaves the store.) Both sides prove the key over both
nonces, so neither a replayed tag nor one side's tag passes as the other's. A peer that fails, or
sends anything else first, gets one ERROR frame and the connection is closed, counted
(``auth_failures``). Without a key the agent refuses to start unless the config sets
``hidden_state_transfer_trusted_network`` (then both sides send empty tags, and a keyed side
refuses an unkeyed one). The handshake authenticates the endpoints, not each later frame: an
on-path attacker who can relay a consumer's connection could still ride it (TLS would bind the
channel); values stay MAC-checked either way.

What one peer may cost a producer: ``hidden_state_transfer_max_peers`` connections served at once
(one more gets an ERROR frame and is closed), each closed after ``hidden_state_transfer_idle_ms``
without a request; every frame (and its reply) within ``hidden_state_transfer_timeout_ms`` of its
first byte, the whole exchange, not each read; request frames of a size the chunk bound allows;
``hidden_state_transfer_peer_leases`` leases and ``_peer_leased_bytes`` bytes per connection, a
connection's leases released when it closes, and a RELEASE of a lease another connection holds
refused. The store bounds each request (``hidden_state_transfer_max_chunks``, a key or slot named
twice refused, ``_max_lease_bytes``) and the leases of all peers together.

Thread safety: ``pull`` may be called from many threads (one control exchange per peer at a time;
READs run concurrently). Every method releases the GIL while it copies, hashes or waits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import os
import socket
import struct
import threading
import time
import uuid
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple, Union

import numpy as np

from . import _hsstore

__all__ = ["NixlAgent", "PullResult", "nixl_available"]

# Frame: type (u8) + length (u32 LE) + payload. Replies use the request's type, or _ERROR.
_HELLO, _PULL, _RELEASE, _ERROR, _AUTH = 1, 2, 3, 4, 5
# What a consumer accepts from an authenticated producer (an export of up to 2^24 entries).
_MAX_FRAME = 256 << 20
# What a producer reads before the peer is authenticated: the handshake's frames only.
_MAX_HANDSHAKE_FRAME = 128
# A request frame's bytes per chunk it may name (a key's three strings are short: model name,
# format, dtype), on top of a fixed part for the slots.
_REQUEST_BYTES_PER_CHUNK = 1024
_REQUEST_BYTES_FIXED = 64 << 10
_HEADER = struct.Struct("<BI")
_AUTH_MAGIC = b"HSSA\x01"
_NONCE_BYTES = 32
_TAG_BYTES = 32
# READ batch: entries are checked per batch as it lands, the later batches still in flight.
_BATCH_BYTES = 16 << 20


def nixl_available() -> bool:
    """True when the nixl package can be imported in this interpreter."""
    import importlib.util

    return importlib.util.find_spec("nixl") is not None


def _import_nixl():
    try:
        import nixl._api as nixl_api  # noqa: WPS433 (optional dependency)
    except ImportError as e:  # the package, or its native libraries, missing
        raise _hsstore.ConfigError(
            "hidden_state_transfer 'nixl' needs the Python package nixl "
            f"(pip install --no-deps nixl-cu13==1.5.1 nixl==1.5.1): {e}"
        ) from e
    return nixl_api


class _FrameTooLarge(ConnectionError):
    """A frame's length is over what this side reads at this point of the exchange."""


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    """n bytes by `deadline` (time.monotonic()): the whole read, however the peer trickles it."""
    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("control exchange past its deadline")
        sock.settimeout(left)
        part = sock.recv(min(n - len(out), 1 << 20))
        if not part:
            raise ConnectionError("peer closed the control connection")
        out += part
    return bytes(out)


def _send_frame(sock: socket.socket, kind: int, payload: bytes, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout("control exchange past its deadline")
    sock.settimeout(left)  # sendall: the bound of the whole send (Python >= 3.5)
    sock.sendall(_HEADER.pack(kind, len(payload)) + payload)


def _recv_frame(sock: socket.socket, deadline: float, limit: int = _MAX_FRAME,
                first: bytes = b"") -> Tuple[int, bytes]:
    """One frame of at most `limit` payload bytes, whole by `deadline`; `first`: the header's
    bytes already read (a producer waits for a request's first byte under the idle bound)."""
    kind, length = _HEADER.unpack(first + _recv_exact(sock, _HEADER.size - len(first), deadline))
    if length > limit:
        raise _FrameTooLarge(f"control frame of {length} bytes is over the limit of {limit}")
    return kind, _recv_exact(sock, length, deadline)


def _parse_address(address: Union[str, Tuple[str, int]]) -> Tuple[str, int]:
    if isinstance(address, tuple):
        return address[0], int(address[1])
    host, sep, port = str(address).rpartition(":")
    if not sep or not host:
        raise _hsstore.InvalidArgument(f"address must be 'host:port', got {address!r}")
    return host.strip("[]"), int(port)


@dataclasses.dataclass
class PullResult:
    """What one pull did. ``tokens`` is the prefix the consumer now holds for the layers (what a
    retrieve would return, KV permitting); ``missed`` says why chunks the consumer wanted were not
    pulled (``None`` when all were)."""

    tokens: int = 0
    chunks_wanted: int = 0
    chunks_pulled: int = 0
    entries_published: int = 0
    entries_rejected: int = 0
    bytes: int = 0
    missed: Optional[str] = None
    seconds: float = 0.0


class _Peer:
    """A consumer's control connection to one producer, and the producer's agent name in NIXL."""

    def __init__(self, sock: socket.socket, remote_agent: str):
        self.sock = sock
        self.remote_agent = remote_agent
        self.lock = threading.Lock()
        self.broken = False


class NixlAgent:
    """One NIXL agent per process, with the store's pinned pool registered once.

    ``target``: an ``hsstore.Engine`` (its config and store are used) or an
    ``hsstore.HiddenStateStore`` with ``config``. ``serve`` starts the control socket that answers
    other agents' pulls (a producer); a consumer that never serves may pass False. The settings
    come from the config (``hidden_state_transfer_*`` keys); keyword arguments override them.
    """

    def __init__(
        self,
        target: Any,
        config: Any = None,
        *,
        serve: bool = True,
        listen: Optional[str] = None,
        backend: Optional[str] = None,
        lease_ms: Optional[int] = None,
        timeout_ms: Optional[int] = None,
        name: Optional[str] = None,
    ):
        if isinstance(target, _hsstore.Engine):
            store = target.hidden_state_store
            if store is None:
                raise _hsstore.ConfigError(
                    "hsstore.nixl: the engine has no hidden-state store "
                    "(enable_hidden_state_cache is false)"
                )
            config = target.config if config is None else config
        elif isinstance(target, _hsstore.HiddenStateStore):
            store = target
        else:
            raise _hsstore.InvalidArgument(
                f"target must be an hsstore.Engine or HiddenStateStore, got {target!r}"
            )
        if config is not None and not isinstance(config, _hsstore.Config):
            config = _hsstore.Config(config)
        settings = _hsstore.transfer_settings(config) if config is not None else {}
        if config is not None and settings["transfer"] != "nixl":
            raise _hsstore.ConfigError(
                "hsstore.nixl needs hidden_state_transfer: nixl in the config, got "
                f"{settings['transfer']!r}"
            )
        nixl_api = _import_nixl()
        self.store = store
        self.backend = backend or settings.get("backend", "UCX")
        self.lease_ms = int(lease_ms or settings.get("lease_ms", 30000))
        self.timeout_s = float(timeout_ms or settings.get("timeout_ms", 10000)) / 1000.0
        listen_at = listen or settings.get("listen", "127.0.0.1:0")
        self.max_peers = int(settings.get("max_peers", 64))
        self.idle_s = float(settings.get("idle_ms", 60000)) / 1000.0
        self.peer_leases = int(settings.get("peer_leases", 64))
        self.peer_leased_bytes = int(settings.get("peer_leased_bytes", 4 << 30))
        self._request_limit = min(
            _MAX_FRAME,
            _REQUEST_BYTES_FIXED + int(settings.get("max_chunks", 4096)) * _REQUEST_BYTES_PER_CHUNK)
        self.name = name or f"hsstore-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._transfer = _hsstore.PoolTransfer(store)
        # The handshake's key is the store's MAC key (the tags are computed in C++: the key never
        # reaches Python). Without one, only a network the config declares trusted.
        self.keyed = self._transfer.handshake_tag("probe", b"") is not None
        if not self.keyed and not settings.get("trusted_network", False):
            raise _hsstore.ConfigError(
                "hsstore.nixl needs hidden_state_mac_key (or hidden_state_mac_key_file): peers "
                "prove they hold it before any address or metadata leaves a producer. On a network "
                "where every host is trusted, set hidden_state_transfer_trusted_network: true")
        self._nixl = nixl_api
        # NIXL's own metadata listener stays off (its default, said here): metadata goes only to
        # peers that passed the handshake on the control socket.
        self._agent = nixl_api.nixl_agent(
            self.name,
            nixl_api.nixl_agent_config(backends=[self.backend], enable_listen_thread=False),
        )
        if self.backend not in self._agent.backends:
            raise _hsstore.ConfigError(
                f"hidden_state_transfer_backend {self.backend!r} is not available in this NIXL "
                f"(plugins: {sorted(self._agent.plugin_list)})"
            )
        regions = [(addr, size, 0, "") for addr, size, _pinned in self._transfer.memory_regions()]
        self._registered = self._agent.register_memory(regions, "DRAM", backends=[self.backend])
        self._peers: Dict[Tuple[str, int], _Peer] = {}
        self._peers_lock = threading.Lock()
        # READs NIXL could not cancel: their granules stay reserved until release succeeds.
        self._stuck: list = []
        self._stats_lock = threading.Lock()
        self._stats = {
            "pulls": 0,
            "pulled_entries": 0,
            "pulled_bytes": 0,
            "missed_pulls": 0,
            "rejected_entries": 0,
            "expired_leases": 0,
            "peer_failures": 0,
            "timeouts": 0,
            "served_pulls": 0,
            "serve_errors": 0,
            # producer: peers refused or cut off (docs/design.md, "Threat model")
            "auth_failures": 0,
            "refused_connections": 0,
            "idle_closed": 0,
            "deadline_closed": 0,
            "refused_pulls": 0,
            "refused_releases": 0,
        }
        self._served = 0  # control connections served now (at most max_peers)
        self._served_lock = threading.Lock()
        self._closed = False
        self._server: Optional[socket.socket] = None
        self._threads: list = []
        # Accepted control connections and their threads: close() ends them (a thread left
        # blocked in recv would hold this agent, so its native store, past the interpreter's exit).
        self._connections: Dict[socket.socket, threading.Thread] = {}
        if serve:
            host, port = _parse_address(listen_at)
            self._server = socket.create_server((host, port))
            self._server.settimeout(0.2)
            thread = threading.Thread(target=self._accept_loop, name="hsstore-nixl-serve", daemon=True)
            thread.start()
            self._threads.append(thread)

    # ------------------------------------------------------------------ producer side
    @property
    def serving(self) -> bool:
        """True when this agent answers other agents' pulls (serve=True)."""
        return self._server is not None

    @property
    def address(self) -> str:
        """host:port of this agent's control socket (what a consumer passes to pull)."""
        if self._server is None:
            raise _hsstore.Error("this NixlAgent does not serve (serve=False)")
        host, port = self._server.getsockname()[:2]
        return f"{host}:{port}"

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._served_lock:
                admitted = self._served < self.max_peers
                if admitted:
                    self._served += 1
            if not admitted:
                self._count("refused_connections")
                self._refuse(conn, b"too many control connections")
                continue
            thread = threading.Thread(target=self._serve_connection, args=(conn,), daemon=True)
            with self._peers_lock:
                if self._closed:
                    with self._served_lock:
                        self._served -= 1
                    conn.close()
                    return
                # close() joins these threads (one left blocked in recv would hold this agent,
                # so its native store, past the interpreter's exit). Started under the lock:
                # close() never joins a thread not yet started.
                self._connections[conn] = thread
                try:
                    thread.start()
                except BaseException:
                    self._connections.pop(conn, None)
                    with self._served_lock:
                        self._served -= 1
                    conn.close()
                    raise

    @staticmethod
    def _refuse(conn: socket.socket, why: bytes) -> None:
        """One ERROR frame (best effort, briefly bounded), then the connection closed."""
        try:
            _send_frame(conn, _ERROR, why, time.monotonic() + 0.5)
        except OSError:
            pass
        finally:
            conn.close()

    def _tag(self, side: str, transcript: bytes) -> bytes:
        tag = self._transfer.handshake_tag(side, transcript)
        return b"" if tag is None else tag

    def _authenticate(self, conn: socket.socket) -> bool:
        """The producer's side of the handshake, whole within timeout_s: True when the peer
        proved the key (it then has the agent's metadata); False after one ERROR frame."""
        deadline = time.monotonic() + self.timeout_s
        try:
            kind, hello = _recv_frame(conn, deadline, _MAX_HANDSHAKE_FRAME)
            if (kind != _HELLO or len(hello) != len(_AUTH_MAGIC) + _NONCE_BYTES
                    or not hello.startswith(_AUTH_MAGIC)):
                raise ConnectionError("not a handshake")  # the same answer as any other failure
            nonce_c = hello[len(_AUTH_MAGIC):]
            nonce_s = os.urandom(_NONCE_BYTES)
            transcript = nonce_c + nonce_s
            _send_frame(conn, _HELLO, _AUTH_MAGIC + bytes([1 if self.keyed else 0]) + nonce_s
                        + self._tag("producer", transcript), deadline)
            kind, tag = _recv_frame(conn, deadline, _MAX_HANDSHAKE_FRAME)
            if kind != _AUTH or not hmac.compare_digest(tag, self._tag("consumer", transcript)):
                raise ConnectionError("wrong tag")
        except (ConnectionError, OSError):
            # A wrong tag, a frame out of place or too long, a peer too slow or gone: one answer.
            self._count("auth_failures")
            self._refuse(conn, b"authentication failed")
            return False
        # Fresh each time: memory registered since (by the caller) is included.
        _send_frame(conn, _AUTH, self._agent.get_agent_metadata(), deadline)
        return True

    def _serve_connection(self, conn: socket.socket) -> None:
        try:
            self._serve(conn)
        finally:
            with self._peers_lock:
                self._connections.pop(conn, None)

    def _serve(self, conn: socket.socket) -> None:
        leases: Dict[int, Tuple[int, float]] = {}  # this connection's: id -> (bytes, deadline)
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._authenticate(conn):
                self._serve_requests(conn, leases)
        except OSError:
            pass
        finally:
            conn.close()
            for lease_id in leases:  # a closed connection can confirm nothing: its leases end
                self._transfer.release(lease_id)
            with self._served_lock:
                self._served -= 1

    def _serve_requests(self, conn: socket.socket, leases: Dict[int, Tuple[int, float]]) -> None:
        while not self._closed:
            try:
                first = _recv_exact(conn, 1, time.monotonic() + self.idle_s)
            except socket.timeout:
                self._count("idle_closed")
                return
            except (ConnectionError, OSError):
                return
            deadline = time.monotonic() + self.timeout_s  # the exchange: request and reply
            try:
                kind, payload = _recv_frame(conn, deadline, self._request_limit, first)
            except _FrameTooLarge:
                self._count("serve_errors")
                self._refuse(conn, b"request frame over the limit")
                return
            except socket.timeout:
                self._count("deadline_closed")
                return
            except (ConnectionError, OSError):
                return
            try:
                if kind == _PULL:
                    reply = self._serve_pull(payload, leases)
                    _send_frame(conn, _PULL if reply[0] else _ERROR, reply[1], deadline)
                elif kind == _RELEASE:
                    (lease_id,) = struct.unpack("<Q", payload)
                    held = leases.pop(lease_id, None) is not None
                    if not held:
                        self._count("refused_releases")  # unknown here, or another peer's
                    valid = held and self._transfer.release(lease_id)
                    _send_frame(conn, _RELEASE, b"\x01" if valid else b"\x00", deadline)
                else:
                    _send_frame(conn, _ERROR, b"unknown request", deadline)
            except (_hsstore.Error, ValueError, struct.error) as e:
                # A malformed request (or a closed store) answers an error; the connection lives.
                self._count("serve_errors")
                _send_frame(conn, _ERROR, str(e).encode()[:4096], deadline)
            except socket.timeout:
                self._count("deadline_closed")
                return

    def _serve_pull(self, payload: bytes, leases: Dict[int, Tuple[int, float]]) -> Tuple[bool, bytes]:
        """(True, export) or (False, why) for a PULL, within this connection's lease budget."""
        now = time.monotonic()
        for lease_id in [i for i, (_n, due) in leases.items() if due < now]:
            del leases[lease_id]  # expired in the store already (its deadline passed)
        if len(leases) >= self.peer_leases:
            self._count("refused_pulls")
            return False, (f"this connection holds {len(leases)} leases "
                           "(hidden_state_transfer_peer_leases)").encode()
        reply, lease_id, leased = self._transfer.serve(payload, self.lease_ms)
        if lease_id:
            held = sum(n for n, _due in leases.values())
            if held + leased > self.peer_leased_bytes:
                self._transfer.release(lease_id)
                self._count("refused_pulls")
                return False, (f"this connection's leases would pin {held + leased} bytes "
                               "(hidden_state_transfer_peer_leased_bytes)").encode()
            leases[lease_id] = (leased, now + self.lease_ms / 1000.0)
        self._count("served_pulls")
        return True, reply

    # ------------------------------------------------------------------ consumer side
    def _peer(self, address: Tuple[str, int], deadline: float) -> _Peer:
        with self._peers_lock:
            peer = self._peers.get(address)
            if peer is not None and not peer.broken:
                return peer
        sock = socket.create_connection(address, timeout=max(0.001, deadline - time.monotonic()))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            metadata = self._handshake(sock, deadline)
            remote_agent = self._agent.add_remote_agent(metadata)
            if isinstance(remote_agent, bytes):
                remote_agent = remote_agent.decode()
        except BaseException:
            sock.close()
            raise
        peer = _Peer(sock, remote_agent)
        with self._peers_lock:
            old = self._peers.get(address)
            self._peers[address] = peer
        if old is not None:
            old.sock.close()
        return peer

    def _handshake(self, sock: socket.socket, deadline: float) -> bytes:
        """The consumer's side of the handshake (module docstring): the producer's metadata once
        each side has proved the key to the other. ConnectionError when the producer fails to
        prove it, refuses this side's proof, or is keyed differently (keyed against unkeyed)."""
        nonce_c = os.urandom(_NONCE_BYTES)
        _send_frame(sock, _HELLO, _AUTH_MAGIC + nonce_c, deadline)
        kind, hello = _recv_frame(sock, deadline, _MAX_HANDSHAKE_FRAME)
        if kind == _ERROR:
            raise ConnectionError("producer refused the handshake: " + hello.decode(errors="replace"))
        head = len(_AUTH_MAGIC) + 1 + _NONCE_BYTES
        if kind != _HELLO or len(hello) < head or not hello.startswith(_AUTH_MAGIC):
            raise ConnectionError("producer answered the handshake out of step (an older hsstore?)")
        producer_keyed = hello[len(_AUTH_MAGIC)] == 1
        if producer_keyed != self.keyed:
            raise ConnectionError(
                "producer and consumer disagree on hidden_state_mac_key: one has a key, the other "
                "none (hidden_state_transfer_trusted_network)")
        nonce_s, tag_p = hello[len(_AUTH_MAGIC) + 1:head], hello[head:]
        transcript = nonce_c + nonce_s
        if not hmac.compare_digest(tag_p, self._tag("producer", transcript)):
            raise ConnectionError("producer failed to prove hidden_state_mac_key")
        _send_frame(sock, _AUTH, self._tag("consumer", transcript), deadline)
        kind, metadata = _recv_frame(sock, deadline)
        if kind == _ERROR:
            raise ConnectionError("producer refused this side's proof of hidden_state_mac_key: "
                                  + metadata.decode(errors="replace"))
        if kind != _AUTH:
            raise ConnectionError("producer answered the handshake out of step")
        return metadata

    def _drop_peer(self, address: Tuple[str, int], peer: _Peer) -> None:
        peer.broken = True
        with self._peers_lock:
            if self._peers.get(address) is peer:
                del self._peers[address]
        try:
            peer.sock.close()
        except OSError:
            pass
        try:
            self._agent.remove_remote_agent(peer.remote_agent)
        except Exception:  # noqa: BLE001 (best effort: the peer is gone either way)
            pass

    def _exchange(self, peer: _Peer, kind: int, payload: bytes, deadline: float) -> bytes:
        with peer.lock:
            # The deadline bounds the whole exchange: a producer trickling its reply a byte at a
            # time holds this thread (LMCache's lookup thread) no longer than the pull's bound.
            _send_frame(peer.sock, kind, payload, deadline)
            reply_kind, reply = _recv_frame(peer.sock, deadline)
        if reply_kind == _ERROR:
            raise _hsstore.Error("producer: " + reply.decode(errors="replace"))
        if reply_kind != kind:
            raise ConnectionError("out-of-step reply on the control connection")
        return reply

    def _read(self, peer: _Peer, pull, deadline: float, hooks) -> str:
        """The one-sided READ of every reserved granule: 'DONE', 'ERR', 'TIMEOUT' or 'STUCK'.

        Batches of whole entries (about _BATCH_BYTES each) are all posted at once, so the link
        stays busy, and each is checked (xxHash3, MAC) as soon as it has landed while the later
        ones are still in flight: the checks hide behind the transfer instead of following it."""
        sizes = pull.entry_bytes()
        batches = []
        first, acc = 0, 0
        for i, n in enumerate(sizes):
            acc += n
            if acc >= _BATCH_BYTES or i == len(sizes) - 1:
                batches.append((first, i + 1 - first))
                first, acc = i + 1, 0
        handles = []
        state = "DONE"
        # NIXL raises its own exceptions (e.g. nixlRemoteDisconnectError for a dead producer)
        # besides answering "ERR": both end the READ as failed.
        try:
            for first, count in batches:
                local_raw, remote_raw = pull.descriptors(first, count)
                local = np.frombuffer(local_raw, dtype=np.uint64).reshape(-1, 3)
                remote = np.frombuffer(remote_raw, dtype=np.uint64).reshape(-1, 3)
                handle = self._agent.initialize_xfer(
                    "READ",
                    self._agent.get_xfer_descs(local, "DRAM"),
                    self._agent.get_xfer_descs(remote, "DRAM"),
                    peer.remote_agent,
                    backends=[self.backend],
                )
                handles.append(handle)
                posted = self._agent.transfer(handle)
                if posted == "ERR":
                    raise ConnectionError("NIXL refused to post the READ")
            if "posted" in hooks:
                hooks["posted"]()
            pending = list(range(len(batches)))
            idle = 0
            while pending and state == "DONE":
                progressed = False
                for k in list(pending):
                    st = self._agent.check_xfer_state(handles[k])
                    if st == "DONE":
                        pending.remove(k)
                        progressed = True
                        if "landed" in hooks:
                            hooks["landed"](pull, *batches[k])
                        pull.check(*batches[k])  # the GIL is released while it hashes
                    elif st != "PROC":
                        state = "ERR"
                        break
                if state != "DONE" or not pending:
                    break
                if time.monotonic() > deadline:
                    state = "TIMEOUT"
                    break
                idle = 0 if progressed else idle + 1
                if idle > 64:
                    time.sleep(0.0002)  # past the first microseconds: yield the core
        except Exception:  # noqa: BLE001 (nixl's error types derive from Exception only)
            state = "ERR"
        stuck = self._release_finished(handles)
        if stuck:
            self._stuck.append((stuck, pull))
            return "STUCK"
        return state

    def _release_finished(self, handles: list) -> list:
        """Releases the handles whose READ is over; returns the others, still in flight.

        A READ given up on (timed out, or its batch failed) may still land: releasing its
        handle does not stop the data of a posted READ (UCX over TCP wrote a timed-out READ's
        data into the consumer's pool once the producer answered, over granules the pool had
        given to another prompt meanwhile: the P/D soak served those rows). So a handle still in
        flight is never released, and its pull's granules stay reserved, until NIXL reports the
        READ over (DONE, or failed with its peer)."""
        left = []
        for handle in handles:
            try:
                in_flight = self._agent.check_xfer_state(handle) == "PROC"
            except Exception:  # noqa: BLE001 (nixl raises for a failed transfer: it is over)
                in_flight = False
            if in_flight:
                left.append(handle)
                continue
            try:
                self._agent.release_xfer_handle(handle)
            except Exception:  # noqa: BLE001 (NIXL could not release it: keep it)
                left.append(handle)
        return left

    def _retry_stuck(self) -> None:
        """The pulls whose READs were still in flight when given up on: each one's granules go
        back to the pool once all its READs are over (checked at every pull, stats and close)."""
        still = []
        for handles, pull in self._stuck:
            left = self._release_finished(handles)
            if left:
                still.append((left, pull))
            else:
                pull.abandon()
        self._stuck = still

    def pull(
        self,
        producer: Union[str, Tuple[str, int]],
        token_ids: Any,
        layers: Sequence[Any] = (0,),
        *,
        timeout: Optional[float] = None,
        _hooks: Optional[Dict[str, Any]] = None,
    ) -> PullResult:
        """Pulls the prompt's chunks this store lacks (and whose KV is present here) from the
        producer at ``producer`` ('host:port'), for ``layers`` (layer indices or (kind, layer)).
        ``token_ids``: the prompt's token ids, or its (start, end, key) chunks where the caller
        keys chunks itself (hsstore.vllm: LMCache's keys, both sides keyed alike).
        Never raises for a producer that is down, slow or wrong: the pull then misses (see
        PullResult.missed) and nothing is left behind. Bounded by ``timeout`` seconds
        (hidden_state_transfer_timeout_ms by default). ``_hooks`` (tests only): callables run at
        'leased' (after the export, before the READ), 'posted' (READ posted) and 'landed' (a
        batch of entries landed, before it is checked; given the pull, first, count)."""
        hooks = _hooks or {}
        started = time.monotonic()
        deadline = started + (self.timeout_s if timeout is None else float(timeout))
        address = _parse_address(producer)
        layers = list(layers)
        if self._stuck:
            self._retry_stuck()
        result = PullResult()
        plan = self._transfer.begin_pull(token_ids, layers)
        if plan is None:  # everything held, or no KV for what is missing
            result.tokens = self.store.coverage(token_ids, layers)
            result.seconds = time.monotonic() - started
            return result
        result.chunks_wanted = plan.end_chunk - plan.first_chunk
        peer = None
        try:
            peer = self._peer(address, deadline)
            try:
                reply = self._exchange(peer, _PULL, plan.request, deadline)
            except (OSError, ConnectionError):
                # A cached connection the producer dropped (a restart) fails before any reply:
                # one fresh connection and one retry, within the same deadline.
                self._drop_peer(address, peer)
                peer = self._peer(address, deadline)
                reply = self._exchange(peer, _PULL, plan.request, deadline)
            plan.reserve(reply)
            if "leased" in hooks:
                hooks["leased"]()
            state = self._read(peer, plan, deadline, hooks)
            if state == "STUCK":
                result.missed = "transfer given up on while still in flight"
                self._count("timeouts")
                self._drop_peer(address, peer)
                return self._finish(result, token_ids, layers, started, missed=True)
            if state != "DONE":
                plan.abandon()
                result.missed = "transfer timed out" if state == "TIMEOUT" else "transfer failed"
                self._count("timeouts" if state == "TIMEOUT" else "peer_failures")
                self._drop_peer(address, peer)
                return self._finish(result, token_ids, layers, started, missed=True)
            valid = True
            if plan.lease_id != 0:
                valid = self._exchange(peer, _RELEASE, struct.pack("<Q", plan.lease_id), deadline) == b"\x01"
            if not valid:
                plan.abandon()
                result.missed = "lease expired"
                self._count("expired_leases")
                return self._finish(result, token_ids, layers, started, missed=True)
            published = plan.publish()
            result.entries_published = published["published"]
            result.entries_rejected = published["rejected"]
            result.bytes = published["bytes"]
            result.chunks_pulled = plan.chunks_covered
            if published["rejected"]:
                result.missed = f"{published['rejected']} entries failed the check"
            elif result.chunks_pulled < result.chunks_wanted:
                result.missed = "the producer or this pool holds fewer chunks"
            with self._stats_lock:
                self._stats["pulls"] += 1
                self._stats["pulled_entries"] += published["published"]
                self._stats["pulled_bytes"] += published["bytes"]
                self._stats["rejected_entries"] += published["rejected"]
                if result.missed:
                    self._stats["missed_pulls"] += 1
            return self._finish(result, token_ids, layers, started)
        except Exception as e:  # noqa: BLE001 (sockets, NIXL, a malformed export)
            # A dead, hung or misbehaving producer: a clean miss.
            plan.abandon()
            result.missed = f"producer failed: {e}"
            self._count("peer_failures")
            if peer is not None:
                self._drop_peer(address, peer)
            return self._finish(result, token_ids, layers, started, missed=True)

    def _finish(self, result: PullResult, token_ids, layers, started, missed=False) -> PullResult:
        if missed:
            with self._stats_lock:
                self._stats["pulls"] += 1
                self._stats["missed_pulls"] += 1
        result.tokens = self.store.coverage(token_ids, layers)
        result.seconds = time.monotonic() - started
        return result

    def _count(self, name: str) -> None:
        with self._stats_lock:
            self._stats[name] += 1

    def stats(self) -> Dict[str, int]:
        """This agent's counters (the store's own: store.stats()['transfer'])."""
        with self._stats_lock:
            out = dict(self._stats)
        out["stuck_transfers"] = len(self._stuck)
        return out

    def close(self) -> None:
        """Stops serving, closes the control connections and deregisters the pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.close()
        for thread in self._threads:
            thread.join(timeout=2)
        with self._peers_lock:
            peers = list(self._peers.items())
            self._peers.clear()
            connections = list(self._connections.items())
        for conn, thread in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)  # its thread's recv returns, the thread ends
            thread.join(timeout=2)
        for _address, peer in peers:
            try:
                peer.sock.close()
            except OSError:
                pass
        if self._stuck:
            self._retry_stuck()
        if not self._stuck:  # a READ still in flight may write there: the pool stays registered
            try:
                self._agent.deregister_memory(self._registered, backends=[self.backend])
            except Exception:  # noqa: BLE001 (teardown)
                pass

    def __enter__(self) -> "NixlAgent":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
