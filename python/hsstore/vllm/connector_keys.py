"""The vLLM connectors' ``hsstore.*`` keys in one table, as src/config/config_keys.cpp is for the
native keys: each key's name, where it is given, its default and what it does. Every module of
hsstore.vllm reads a key through :func:`option` (or names it through :data:`KEYS`), never by a
literal of its own; docs/vllm.md's "vLLM connector keys" table is checked against this one row by
row (python/tests/test_connector_keys.py).

Two places a key is given:

* ``config``: ``kv_connector_extra_config`` of vLLM's ``--kv-transfer-config``, written by the
  operator (hsstore.vllm.HiddenStates writes it). Trusted.
* ``request``: a request's ``kv_transfer_params``, written by the HTTP client (vLLM's OpenAI server
  passes them through). Untrusted: hsstore.vllm.transfer checks a named producer against the
  allow-list, and the connector drops every ``lmcache.hsstore.*`` key a client wrote
  (docs/design.md, "Threat model").

Validation stays with the module that uses a key (layers.py, output.py, identity.py,
transfer.py): the table says what exists and what it defaults to, not what a value must be.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Tuple

__all__ = ["CONFIG", "REQUEST", "ConnectorKey", "KEYS", "default_of", "option"]

CONFIG = "config"  # kv_connector_extra_config: the operator's
REQUEST = "request"  # kv_transfer_params: the client's


@dataclasses.dataclass(frozen=True)
class ConnectorKey:
    """One key: its name, where it is given (CONFIG or REQUEST), its default and its meaning (the
    README's row)."""

    name: str
    where: str
    default: Any
    doc: str


_TABLE: Tuple[ConnectorKey, ...] = (
    ConnectorKey("hsstore.layers", CONFIG, [-1],
                 "layers to keep, all required (hsstore.vllm.layers): -1 the final state, k the "
                 "residual stream after decoder layer k; \"eagle3\" the layers vLLM's EAGLE-3 "
                 "draft reads for this engine (hsstore.vllm.eagle3)"),
    ConnectorKey("hsstore.store", CONFIG, "hsstore",
                 "\"hsstore\" (the drop-in) or \"lmcache\" (LMCache's own hidden-state store; "
                 "the in-process connector only)"),
    ConnectorKey("hsstore.config", CONFIG, None,
                 "the hsstore Engine's config, a dict (HiddenStateConnector and the MP "
                 "connector; the drop-in takes LMCache's config)"),
    ConnectorKey("hsstore.keep", CONFIG, True,
                 "hold finished prompts for take(); false in a server (nobody takes them)"),
    ConnectorKey("hsstore.output_dir", CONFIG, None,
                 "also write each finished prompt's hidden states to this directory, one "
                 "safetensors file per request id and tenant (hsstore.vllm.output; the "
                 "directory must be this user's, not writable by others)"),
    ConnectorKey("hsstore.output_max_pending", CONFIG, 256,
                 "prompts queued for the output writer at most (past it a file is dropped, "
                 "counted)"),
    ConnectorKey("hsstore.output_max_pending_bytes", CONFIG, 2 << 30,
                 "bytes of the queued prompts' tensors at most (past it a file is dropped, "
                 "counted)"),
    ConnectorKey("hsstore.output_max_bytes", CONFIG, 16 << 30,
                 "bytes of files kept in hsstore.output_dir (the oldest deleted beyond it, "
                 "counted)"),
    ConnectorKey("hsstore.worker_init", CONFIG, None,
                 "\"module:function\" called in each worker before LMCache starts (tests install "
                 "LMCache's CPU copy path with it: hsstore.vllm.testing)"),
    ConnectorKey("hsstore.nixl", CONFIG, None,
                 "prefill/decode over NIXL (hsstore.vllm.transfer): {\"listen\": \"host:port\"} "
                 "serves, {\"producer\": \"host:port\"} or {\"pull\": true} pulls; "
                 "\"producers\" the allow-list a request may name, \"trusted_network\" pulls "
                 "without a MAC key"),
    ConnectorKey("hsstore.model_revision", CONFIG, None,
                 "a name for the weights, in every key (hsstore.vllm.identity: with vLLM's model "
                 "revision and a hash of the model's config)"),
    ConnectorKey("hsstore.salt_key_file", CONFIG, None,
                 "a file holding the deployment's secret: each cache_salt enters the keys as its "
                 "HMAC-SHA256 under it, not a plain SHA-256 (hsstore.salt)"),
    ConnectorKey("hsstore.producer", REQUEST, None,
                 "the producer (\"host:port\") to pull this request's hidden states from; pulled "
                 "from only if on the decode engine's allow-list"),
    ConnectorKey("hsstore.producer_port", REQUEST, None,
                 "with NixlConnector's remote_host: the producer's port (default: the "
                 "configured producer's)"),
)

#: Every key by name.
KEYS: Dict[str, ConnectorKey] = {key.name: key for key in _TABLE}


def default_of(name: str) -> Any:
    """Key `name`'s default (a fresh copy of a list default); KeyError for a name not in the
    table."""
    default = KEYS[name].default
    return list(default) if isinstance(default, list) else default


def option(given: Mapping[str, Any], name: str) -> Any:
    """The value of key `name` in `given` (a kv_connector_extra_config or a request's
    kv_transfer_params), else its default (a fresh copy of a list or dict default). KeyError for
    a name the table does not have: a key is added to the table first."""
    if name not in KEYS:
        raise KeyError(f"{name!r} is not in hsstore.vllm.connector_keys' table")
    return given[name] if name in given else default_of(name)
