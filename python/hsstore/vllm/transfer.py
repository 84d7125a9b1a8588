"""Prefill/decode disaggregation: a decode worker pulls the prompt's hidden states from the prefill
worker's pool over NIXL (hsstore.nixl), while the KV crosses as LMCache moves it (a shared remote
backend such as ``remote_url: redis://...``).

Configuration, one key of ``kv_connector_extra_config`` (``HiddenStates(nixl=...)`` writes it)::

    prefill:  "hsstore.nixl": {"listen": "0.0.0.0:5555"}          serve this worker's pool
    decode:   "hsstore.nixl": {"producer": "prefill-host:5555"}    pull what is missing from it

A router that picks the prefill host per request names it in the request's ``kv_transfer_params``
(where vLLM's NixlConnector takes its remote host), and that producer is pulled from instead of
the configured one::

    "hsstore.producer": "prefill-b:5555"      the producer's "listen" address, or
    "remote_host": "prefill-b"                 NixlConnector's key, with the port of
                                               "hsstore.producer_port" (a request key) or, when
                                               absent, of the configured "producer"

(NixlConnector's ``remote_port`` is its own side channel, not hsstore's, and is not used.) A
decode engine with no default producer says ``{"pull": true}``. Without a named producer, the
configured ``producer`` is used; with neither, nothing is pulled. A producer that is unknown,
dead or hung is a counted miss (``pulls_missed``) within ``timeout_ms``: the hit is capped and
vLLM recomputes. The scheduler side carries the name to the worker's lookup in LMCache's request
configs (key ``lmcache.hsstore.producer``: LMCache forwards ``lmcache.*`` keys of
``kv_transfer_params`` to the lookup, and keys chunks only by ``lmcache.tag.*``, so the KV keys do
not change).

A request's kv_transfer_params come from the HTTP client (vLLM's OpenAI server passes them
through): nothing in them is trusted (docs/design.md, "Threat model"). So

* a named producer is pulled from only if it matches the allow-list ``producers`` (host:port
  patterns, ``*`` and ``?`` wildcards; the configured ``producer`` is always on it, and is all of
  it by default). Any other name, malformed ones included, is refused: no connection is made,
  the request pulls from nobody (not the default either: the router asked for that producer),
  its hit is capped and ``pulls_refused`` counted;
* a worker that does not pull (no ``producer``, no ``pull``) ignores every name;
* the scheduler drops every ``lmcache.hsstore.*`` key a client wrote before it writes its own
  (connector.py), and the worker checks the allow-list again before it connects;
* a pulling worker refuses to start without a MAC key on its store (``hidden_state_mac_key`` or
  ``_file``: a producer's rows carry an xxHash3 check the sender computes, so without a MAC any
  peer that answers could publish rows of its choosing under the request's keys), unless
  ``"trusted_network": true`` says the network and every producer on it are trusted (logged at
  start as a warning).

``listen``, ``backend``, ``lease_ms`` and ``timeout_ms`` are hsstore's ``hidden_state_transfer_*``
config keys (README, "Configuration keys"), validated by the same table; ``producer`` is the
prefill worker's ``listen`` address. Both may be given (a worker that serves and pulls).
``timeout_ms`` bounds one pull and must stay below LMCache's ``lookup_timeout_ms`` (3000 by
default): the lookup that waits for the pull is abandoned by LMCache's lookup client at that bound
(as no hit), so a longer pull could only be wasted. Unset, it is half of ``lookup_timeout_ms``.

Where the pull happens (decode side): LMCache's lookup, which the connector already wraps to cap
the hit at the hidden-state coverage (connector.py). When LMCache reports a KV hit that the local
hidden states do not cover, the missing chunks of that hit are pulled first, and the cap applies
to what the store holds afterwards. So KV presence on this side still decides the prefix (a pull
asks only for chunks whose KV LMCache holds here), and a pull that fails, times out or brings
fewer chunks only means a smaller hit and a recompute, never a truncated prefix. A pull waits at
most ``timeout_ms`` (the lookup, and so the scheduler, waits with it), and is tried once per
lookup: LMCache caches a request's lookup, so a dead producer costs each request one refused
connection. In LMCache's MP mode (hsstore.vllm.mp_connector) the engines share the server's KV
and the pull runs on a thread of the decode scheduler's connector while it answers "not yet" for
that request (no LMCache lookup waits on it there, so ``timeout_ms`` has no upper bound; unset,
1500).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import fnmatch
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .connector_keys import option

__all__ = ["PRODUCER_CONFIG", "REFUSED", "HiddenStateTransfer", "TransferOptions",
           "parse_options", "request_producer"]

logger = logging.getLogger("hsstore.vllm")

# The "hsstore.nixl" keys that are hsstore config keys (one table: README, "Configuration keys").
_CONFIG_KEYS = {
    "listen": "hidden_state_transfer_listen",
    "backend": "hidden_state_transfer_backend",
    "lease_ms": "hidden_state_transfer_lease_ms",
    "timeout_ms": "hidden_state_transfer_timeout_ms",
}
_KEYS = ("producer", "pull", "producers", "trusted_network", *_CONFIG_KEYS)
# The request config (LMCache's, from kv_transfer_params' "lmcache.*" keys) that carries a
# request's producer from the scheduler to the worker's lookup.
PRODUCER_CONFIG = "lmcache.hsstore.producer"
# What request_producer answers (and the scheduler carries) for a name off the allow-list: the
# request pulls from nobody. Not an address (no port), so it can never be connected to.
REFUSED = "refused"


@dataclasses.dataclass(frozen=True)
class TransferOptions:
    """The parsed "hsstore.nixl" value."""

    # hsstore config keys (hidden_state_transfer: nixl and the keys given), checked by
    # hsstore.Config at parse time. A plain dict, not a native Config: the scheduler's connector
    # keeps these options until the interpreter exits, and a native object still alive then is a
    # nanobind "leaked instance" at exit (the P/D soak's finding, docs/reliability.md).
    settings: Dict[str, Any]
    serve: bool  # "listen" given: this worker serves its pool
    producer: Optional[str]  # "producer" given: this worker pulls from there by default
    timeout_ms: Optional[int]  # "timeout_ms" as given (None: derived from LMCache's lookup)
    pull: bool = False  # this worker pulls ("producer" given, or "pull": true)
    # The producers a request may name: host:port patterns ("producers" and "producer").
    producers: Tuple[str, ...] = ()
    trusted_network: bool = False  # pull without a MAC key ("trusted_network": true)

    def allows(self, address: str) -> bool:
        """`address` (a request's producer) is on the allow-list."""
        return self.pull and _allowed(address, self.producers)


def _check_address(value: Any) -> str:
    host, sep, port = str(value).rpartition(":") if isinstance(value, str) else ("", "", "")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"hsstore.nixl: 'producer' must be 'host:port' (the prefill worker's "
                         f"'listen' address), got {value!r}")
    return value


def _split(address: str) -> Tuple[str, str]:
    host, _, port = address.rpartition(":")
    return host.lower(), port


def _check_pattern(value: Any) -> str:
    """An allow-list entry: 'host:port', either part with * and ? wildcards."""
    host, sep, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if not sep or not host or not port or not all(c.isdigit() or c in "*?" for c in port):
        raise ValueError(f"hsstore.nixl: every entry of 'producers' must be a 'host:port' "
                         f"pattern (* and ? wildcards), got {value!r}")
    return value


def _matches(text: str, pattern: str) -> bool:
    # Only * and ? are wildcards ("[" is literal: an IPv6 host is written in brackets).
    if "*" not in pattern and "?" not in pattern:
        return text == pattern
    return fnmatch.fnmatchcase(text, pattern.replace("[", "[[]"))


def _allowed(address: Any, patterns: Sequence[str]) -> bool:
    """`address` is a well-formed host:port that one of `patterns` matches (host case-blind)."""
    if not isinstance(address, str):
        return False
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return False
    host = host.lower()
    for pattern in patterns:
        pattern_host, pattern_port = _split(pattern)
        if _matches(host, pattern_host) and _matches(port, pattern_port):
            return True
    return False


def parse_options(value: Any, *, lmcache: bool = True,
                  store: str = "hsstore") -> Optional[TransferOptions]:
    """The "hsstore.nixl" option (None: off) of a capture with (`lmcache`, `store`). ValueError
    naming the key for a malformed value, or where the capture cannot pull (no LMCache: no KV
    hits to fill; LMCache's own store: no pool to register); hsstore.ConfigError for a bad hsstore
    key, or where the nixl package is not installed."""
    if value is None:
        return None
    if not lmcache or store != "hsstore":
        raise ValueError("hsstore.nixl needs LMCache and hsstore's store (lmcache=True, "
                         f"store='hsstore'; got lmcache={lmcache}, store={store!r}): the decode "
                         "side pulls hidden states for the KV hits LMCache reports")
    if not isinstance(value, dict):
        raise ValueError(f"hsstore.nixl must be a dict ({{'listen': 'host:port'}} on the prefill "
                         f"side, {{'producer': 'host:port'}} on the decode side), got {value!r}")
    unknown = sorted(set(value) - set(_KEYS))
    if unknown:
        raise ValueError(f"hsstore.nixl: unknown keys {unknown} (known: {list(_KEYS)})")
    if "pull" in value and not isinstance(value["pull"], bool):
        raise ValueError(f"hsstore.nixl: 'pull' must be true or false, got {value['pull']!r}")
    if "listen" not in value and "producer" not in value and not value.get("pull"):
        raise ValueError("hsstore.nixl needs 'listen' (prefill: serve this worker's hidden states), "
                         "'producer' (decode: pull missing ones from that address) or 'pull': "
                         "true (decode: pull from the producer each request names), or several")
    producer = _check_address(value["producer"]) if "producer" in value else None
    patterns = value.get("producers", [])
    if not isinstance(patterns, (list, tuple)):
        raise ValueError(f"hsstore.nixl: 'producers' must be a list of 'host:port' patterns, "
                         f"got {patterns!r}")
    producers = tuple(_check_pattern(pattern) for pattern in patterns)
    if producer is not None and producer not in producers:
        producers = (producer, *producers)
    if value.get("pull") and not producers:
        raise ValueError("hsstore.nixl: 'pull': true without a 'producer' needs 'producers', the "
                         "allow-list of host:port patterns a request may name (a request's "
                         "kv_transfer_params come from the client)")
    trusted = value.get("trusted_network", False)
    if not isinstance(trusted, bool):
        raise ValueError(f"hsstore.nixl: 'trusted_network' must be true or false, got {trusted!r}")
    import hsstore

    settings = {"hidden_state_transfer": "nixl"}
    settings.update({_CONFIG_KEYS[k]: v for k, v in value.items() if k in _CONFIG_KEYS})
    # One switch for both ends: the puller's MAC check below and the agent's handshake
    # (hsstore.nixl refuses an unkeyed agent, serving or pulling, unless the network is trusted).
    settings["hidden_state_transfer_trusted_network"] = trusted
    hsstore.Config(settings)  # the table's checks; ConfigError without nixl
    return TransferOptions(settings=settings, serve="listen" in value, producer=producer,
                           timeout_ms=int(value["timeout_ms"]) if "timeout_ms" in value else None,
                           pull=producer is not None or bool(value.get("pull")),
                           producers=producers, trusted_network=trusted)


def request_producer(params: Any, options: Optional[TransferOptions]) -> Optional[str]:
    """The producer a request's kv_transfer_params name ("hsstore.producer", or NixlConnector's
    "remote_host" with "hsstore.producer_port" or the configured producer's port) if the
    allow-list has it, REFUSED for a name it has not (malformed ones too), or None (no name, or
    a worker that does not pull: use the configured one)."""
    if options is None or not options.pull or not isinstance(params, dict):
        return None
    named = _named_producer(params, options)
    if named is None:
        return None
    if not options.allows(named):
        logger.warning("hsstore.vllm: a request names producer %r, which is not on the "
                       "allow-list (hsstore.nixl 'producers'): not pulling for it", named[:200])
        return REFUSED
    return named


def _named_producer(params: Dict[str, Any], options: TransferOptions) -> Optional[str]:
    named = option(params, "hsstore.producer")
    if named:
        return str(named)
    host = params.get("remote_host")
    if not host:
        return None
    port = option(params, "hsstore.producer_port")
    if port is None and options.producer is not None:
        port = options.producer.rpartition(":")[2]
    if port is None:
        logger.warning("hsstore.vllm: a request names remote_host %r but no hsstore port "
                       "(\"hsstore.producer_port\", or a configured producer): not pulling "
                       "from it", host)
        return None
    return f"{host}:{port}"


def pull_timeout_ms(options: TransferOptions, lookup_timeout_ms: int) -> int:
    """The bound on one pull: "timeout_ms", below LMCache's lookup_timeout_ms (ValueError
    otherwise), or half of it when unset."""
    if options.timeout_ms is None:
        return max(1, lookup_timeout_ms // 2)
    if options.timeout_ms >= lookup_timeout_ms:
        raise ValueError(f"hsstore.nixl: timeout_ms ({options.timeout_ms}) must be below LMCache's "
                         f"lookup_timeout_ms ({lookup_timeout_ms}): LMCache's lookup client gives "
                         "up on the lookup that waits for the pull at that bound")
    return options.timeout_ms


def check_authenticated_pulls(options: TransferOptions, config: Any) -> None:
    """A pulling worker's store must check a MAC on what it pulls (`config`: the store's hsstore
    Config), unless "trusted_network" says otherwise (logged); ValueError naming the keys."""
    if config.hidden_state_mac_key or config.hidden_state_mac_key_file:
        return
    if not options.trusted_network:
        raise ValueError("hsstore.nixl: this worker pulls, but its store has no MAC key "
                         "(hidden_state_mac_key or hidden_state_mac_key_file): a producer's "
                         "rows would be checked only against the xxHash3 the sender computes, "
                         "so any peer that answers could publish rows of its choosing. Set the "
                         "key (the producers' too), or \"trusted_network\": true where every "
                         "host that can answer is trusted")
    logger.warning("hsstore.vllm: hsstore.nixl pulls without a MAC key (\"trusted_network\": "
                   "true): rows are accepted from any producer on the allow-list %s that "
                   "answers, unauthenticated", list(options.producers))


class HiddenStateTransfer:
    """One worker's NIXL side: an agent over its store's pool (registered once), serving it
    (``listen``) and pulling from a producer (``producer``).

    Thread safety: ``fill`` runs on LMCache's lookup thread, the agent's server on its own; both
    are hsstore.nixl's (any thread). ``count`` is the connector's counter function."""

    def __init__(self, options: TransferOptions, store: Any, count: Callable[..., None],
                 lookup_timeout_ms: int) -> None:
        import hsstore.nixl

        self.store = store
        self.options = options
        self.producer = options.producer
        self.timeout_s = pull_timeout_ms(options, lookup_timeout_ms) / 1000.0
        self._count = count
        if options.pull:
            check_authenticated_pulls(options, store.native.config)
        self.agent = hsstore.nixl.NixlAgent(store.native, options.settings, serve=options.serve)
        if options.serve:
            logger.info("hsstore.vllm: serving hidden states over NIXL on %s", self.agent.address)

    def fill(self, chunks: Sequence[Any], labels: List[int], hit: int,
             producer: Optional[str] = None) -> None:
        """Pulls, from `producer` (the request's) or the configured one, the chunks of the hit
        [0, hit) that the local store lacks (only those whose KV is present here); the caller
        then caps the hit at the coverage."""
        if not self.options.pull:
            return  # a worker that only serves never connects anywhere for a request
        producer = producer or self.producer
        if producer is None:
            return
        if not self.options.allows(producer):
            self._count(pulls_refused=1)
            return
        wanted = [chunk for chunk in chunks if chunk[0] < hit]
        started = time.perf_counter_ns()
        try:
            result = self.store.pull(self.agent, producer, wanted, labels, self.timeout_s)
        except Exception:  # noqa: BLE001 (a pull must never break LMCache's lookup)
            self._count(pulls=1, pulls_missed=1, pull_ns=time.perf_counter_ns() - started)
            logger.exception("hsstore.vllm: pulling hidden states from %s failed; the hit is "
                             "capped at what is held here", producer)
            return
        self._count(pulls=1, pulled_chunks=result.chunks_pulled,
                    pulls_missed=1 if result.missed else 0,
                    pull_ns=time.perf_counter_ns() - started)
        if result.missed:
            logger.warning("hsstore.vllm: pulled %d of %d chunks of hidden states from %s (%s); "
                           "the rest is recomputed", result.chunks_pulled, result.chunks_wanted,
                           producer, result.missed)

    def stats(self) -> Dict[str, Any]:
        out: Dict[str, Any] = dict(self.agent.stats())
        out["producer"] = self.producer
        out["address"] = self.agent.address if self.agent.serving else None
        return out

    def close(self) -> None:
        self.agent.close()
