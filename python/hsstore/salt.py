"""Tenants: vLLM's per-request ``cache_salt`` in hidden-state keys, one rule for every store.

vLLM mixes a request's ``cache_salt`` into its block hashes, and LMCache's MP server slices its
lookups by it, so one tenant's KV is never another's prefix hit. Hidden states follow the same
rule: a salted request's hidden states live under keys of its own. The salt's digest is folded
into the native key's ``fmt`` (as hsstore.lmcache folds LMCache's key tags), and ``fmt`` is part
of the key everywhere it goes: the pool's index, the disk tier's file names, Redis/Valkey key
names and the NIXL wire. So a request with one salt neither hits nor sees (coverage, pulls,
tiers) the hidden states stored under another, and an unsalted request keeps today's keys.

The KV is asked with the chunk's unsalted key where the KV store ignores the salt (LMCache's
in-process engine, 0.5.6): the hit is then min(KV, the salted hidden-state coverage), so a tenant
still gets no prefix hit from another tenant's prompts (its own hidden states are missing).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Optional

__all__ = ["SaltedKey", "salt_suffix", "salted_native_key", "salted"]

_DIGEST_HEX = 32  # 128 bits of SHA-256: distinct salts never share a key in practice


def salt_suffix(salt: Optional[str]) -> str:
    """What a salt adds to a key's ``fmt`` ("" for no salt: an unsalted key is today's key)."""
    if not salt:
        return ""
    return "@salt%" + hashlib.sha256(str(salt).encode()).hexdigest()[:_DIGEST_HEX]


def salted_native_key(key: Any, salt: Optional[str]) -> Any:
    """An hsstore ``CacheEngineKey`` in the namespace of `salt` (`key` itself for no salt)."""
    if not salt:
        return key
    from . import _hsstore

    return _hsstore.CacheEngineKey(model_name=key.model_name, world_size=key.world_size,
                                   worker_id=key.worker_id, chunk_hash=key.chunk_hash,
                                   kv_dtype=key.kv_dtype, fmt=key.fmt + salt_suffix(salt))


@dataclasses.dataclass(frozen=True)
class SaltedKey:
    """An LMCache chunk key with a request's salt, as hsstore.lmcache's chunk lists carry it: the
    hidden states are keyed by both, LMCache's KV presence is asked with ``key`` alone."""

    key: Any
    salt: str


def salted(key: Any, salt: Optional[str]) -> Any:
    """`key` (an LMCache key) for a request salted with `salt` (`key` itself for no salt)."""
    return SaltedKey(key, str(salt)) if salt else key
