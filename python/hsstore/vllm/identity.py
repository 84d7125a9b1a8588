"""What a worker's hidden-state keys depend on besides tokens and tenant: the model's identity and
the deployment's salt key (hsstore.salt.KeyNamespace), from vLLM's config and two connector keys::

    hsstore.model_revision   a name for the weights (a checkpoint id), for weights that change in
                             place: same model path, same revision, same config
    hsstore.salt_key_file    a file holding the deployment's secret (>= 16 bytes; one trailing
                             newline ignored): salts enter keys as their HMAC-SHA256 under it

A hidden state is a function of the weights. LMCache's key carries only the model's name, so new
weights under the same name (a restart after an upgrade, a disk tier or Redis kept across it)
would serve the old weights' rows. The namespace therefore holds vLLM's ``model_config.revision``,
a SHA-256 of the model's config (``hf_config``, without the fields a copy of the same model at
another path or with another transformers version differs in) and ``hsstore.model_revision``.
What it cannot see: weights replaced in place with the same config, revision and no
``hsstore.model_revision`` (hashing the weights themselves would cost a read of every file at
start). Every engine that shares a tier or pulls from another must have the same identity and
salt key (a prefill/decode pair: the same connector keys and model).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, Optional, Tuple

from ..salt import KeyNamespace
from .connector_keys import option

__all__ = ["key_namespace", "model_identity", "read_salt_key"]

_MIN_SALT_KEY_BYTES = 16
# hf_config fields that differ between copies of one model, never between weights.
_PLACE_FIELDS = ("_name_or_path", "transformers_version", "_commit_hash", "_attn_implementation",
                 "_attn_implementation_internal")


def _config_hash(hf_config: Any) -> str:
    if hf_config is None:
        return ""
    values = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(vars(hf_config))
    for name in _PLACE_FIELDS:
        values.pop(name, None)
    text = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def model_identity(model_config: Any, extra: Dict[str, Any]) -> Tuple[str, ...]:
    """(revision, config hash, operator's revision) of the weights vLLM loads."""
    operator = option(extra, "hsstore.model_revision")
    if operator is not None and (not isinstance(operator, str) or not operator):
        raise ValueError(f"hsstore.model_revision must be a non-empty string, got {operator!r}")
    return ("revision", str(getattr(model_config, "revision", None) or ""),
            "config", _config_hash(getattr(model_config, "hf_config", None)),
            "operator", operator or "")


def read_salt_key(extra: Dict[str, Any]) -> Optional[bytes]:
    """The secret of ``hsstore.salt_key_file``, or None when the key is not set; ValueError
    naming the key for a file that cannot be read or is too short (the secret is never shown)."""
    path = option(extra, "hsstore.salt_key_file")
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            secret = file.read()
    except (OSError, TypeError) as error:
        raise ValueError(f"hsstore.salt_key_file: cannot read {path!r}: {error}") from None
    if secret.endswith(b"\n"):
        secret = secret[:-1]
    if len(secret) < _MIN_SALT_KEY_BYTES:
        raise ValueError(f"hsstore.salt_key_file: {path!r} holds {len(secret)} bytes, the key "
                         f"must be at least {_MIN_SALT_KEY_BYTES} (128 bits)")
    return secret


def key_namespace(vllm_config: Any, extra: Dict[str, Any]) -> KeyNamespace:
    """The namespace of every hidden-state key of this engine."""
    return KeyNamespace(model=model_identity(vllm_config.model_config, extra),
                        salt_key=read_salt_key(extra))
