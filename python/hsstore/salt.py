"""Key namespaces: what, besides the tokens, a hidden state's key depends on, one rule for every
store: vLLM's per-request ``cache_salt`` (tenants), LMCache's key tags, and the model's identity.

vLLM mixes a request's ``cache_salt`` into its block hashes, and LMCache's MP server slices its
lookups by it, so one tenant's KV is never another's prefix hit. Hidden states follow the same
rule: a salted request's hidden states live under keys of its own. The namespace is folded into
the native key's ``fmt``, and ``fmt`` is part of the key everywhere it goes: the pool's index, the
disk tier's file names, Redis/Valkey key names and the NIXL wire. So a request with one salt
neither hits nor sees (coverage, pulls, tiers) the hidden states stored under another, and an
unsalted, untagged request of a store without a model identity keeps today's key.

The encoding is injective: ``fmt`` becomes ``<kind>~<32 hex digits>``, the first 128 bits of
SHA-256 over length-prefixed fields (the previous ``fmt``, then each field's parts, each part
prefixed by its byte length), so no choice of tag names or values can spell a salt, another tag
set or another model (a tag ``("salt", ...)`` is a field of kind "tag", never of kind "salt"),
and ``fmt`` has no ``@`` of its own to shift the key's string form. The salt enters as its digest:
HMAC-SHA256 under the deployment's salt key where one is configured (``hsstore.salt_key_file``),
else SHA-256. Without the key, whoever can read key names (the disk tier's files, a shared Redis)
can test guessed salts against them offline; with it, not.

The KV is asked with the chunk's unsalted key where the KV store ignores the salt (LMCache's
in-process engine, 0.5.6): the hit is then min(KV, the salted hidden-state coverage), so a tenant
still gets no prefix hit from another tenant's prompts (its own hidden states are missing).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from typing import Any, Iterable, Optional, Sequence, Tuple, Union

__all__ = ["KeyNamespace", "RequestKeys", "SaltedKey", "namespace_fmt", "salt_field",
           "salted", "salted_native_key", "split_request_keys"]

_DIGEST_HEX = 32  # 128 bits of SHA-256: distinct namespaces never share a key in practice
_DOMAIN = b"hsstore-key-namespace-v1"

Field = Tuple[str, ...]


def _framed(parts: Iterable[str]) -> bytes:
    out = bytearray()
    for part in parts:
        data = str(part).encode("utf-8", "surrogatepass")
        out += len(data).to_bytes(8, "big") + data
    return bytes(out)


def namespace_fmt(fmt: str, fields: Sequence[Field]) -> str:
    """`fmt` in the namespace of `fields` (each a tuple of strings: ("salt", digest),
    ("tag", name, value), ("model", ...)); `fmt` itself when there are none."""
    if not fields:
        return fmt
    digest = hashlib.sha256()
    digest.update(_framed((_DOMAIN.decode(), fmt)))
    for field in fields:
        digest.update(len(field).to_bytes(8, "big") + _framed(field))
    kind = fmt.split("~", 1)[0]
    return f"{kind}~{digest.hexdigest()[:_DIGEST_HEX]}"


def salt_field(salt: Optional[str], salt_key: Optional[bytes] = None) -> Tuple[Field, ...]:
    """The namespace field of a request's salt (none for no salt): its HMAC-SHA256 under
    `salt_key` (the deployment's secret) when given, else its SHA-256."""
    if not salt:
        return ()
    data = str(salt).encode("utf-8", "surrogatepass")
    if salt_key:
        return (("salt-hmac", hmac.new(salt_key, data, hashlib.sha256).hexdigest()),)
    return (("salt", hashlib.sha256(data).hexdigest()),)


@dataclasses.dataclass(frozen=True)
class KeyNamespace:
    """A store's own part of its keys' namespace: the model's identity (weights revision, a hash
    of its config: hsstore.vllm.identity) and the deployment's salt key."""

    model: Tuple[str, ...] = ()
    salt_key: Optional[bytes] = dataclasses.field(default=None, repr=False)

    def fields(self, salt: Optional[str] = None,
               tags: Sequence[Tuple[Any, Any]] = ()) -> Tuple[Field, ...]:
        model = (("model", *self.model),) if self.model else ()
        tag_fields = tuple(("tag", str(name), str(value)) for name, value in tags or ())
        return model + tag_fields + salt_field(salt, self.salt_key)


NO_NAMESPACE = KeyNamespace()


@dataclasses.dataclass(frozen=True)
class RequestKeys:
    """What a request adds to its keys beyond the tokens: vLLM's cache_salt and LMCache's
    request configs that tag its keys (``lmcache.tag.*``, in the request's order). A store's
    ``chunks(tokens, salt)`` takes one where a plain salt string is not enough."""

    salt: str = ""
    tags: Tuple[Tuple[str, Any], ...] = ()  # (request config key, value)

    def __bool__(self) -> bool:
        return bool(self.salt or self.tags)

    def request_configs(self) -> Optional[dict]:
        return dict(self.tags) if self.tags else None


def split_request_keys(salt: Union[None, str, RequestKeys]) -> Tuple[str, Optional[dict]]:
    """(salt, LMCache request configs of the tags) of a store's `salt` argument."""
    if isinstance(salt, RequestKeys):
        return salt.salt, salt.request_configs()
    return str(salt or ""), None


def salted_native_key(key: Any, salt: Union[None, str, RequestKeys],
                      namespace: KeyNamespace = NO_NAMESPACE) -> Any:
    """An hsstore ``CacheEngineKey`` in the namespace of `salt` and `namespace` (`key` itself
    for neither)."""
    salt, _ = split_request_keys(salt)
    fields = namespace.fields(salt)
    if not fields:
        return key
    from . import _hsstore

    return _hsstore.CacheEngineKey(model_name=key.model_name, world_size=key.world_size,
                                   worker_id=key.worker_id, chunk_hash=key.chunk_hash,
                                   kv_dtype=key.kv_dtype, fmt=namespace_fmt(key.fmt, fields))


@dataclasses.dataclass(frozen=True)
class SaltedKey:
    """An LMCache chunk key with a request's salt, as hsstore.lmcache's chunk lists carry it: the
    hidden states are keyed by both, LMCache's KV presence is asked with ``key`` alone."""

    key: Any
    salt: str


def salted(key: Any, salt: Optional[str]) -> Any:
    """`key` (an LMCache key) for a request salted with `salt` (`key` itself for no salt)."""
    return SaltedKey(key, str(salt)) if salt else key
