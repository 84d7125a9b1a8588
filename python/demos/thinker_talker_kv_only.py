"""The KV-only thinker of python/demos/thinker_talker.py (the counter-example): vLLM's
LMCacheConnectorV1 as it is, plus the CPU KV copy path LMCache 0.5.6 lacks
(hsstore.vllm.testing, installed in the worker before LMCache builds its engine, as
``hsstore.worker_init`` does for hsstore's connector). No hidden states are cached."""

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import LMCacheConnectorV1


class KVOnlyLMCacheConnector(LMCacheConnectorV1):
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        if role == KVConnectorRole.WORKER:
            from hsstore.vllm.testing import install_cpu_kv_connector

            install_cpu_kv_connector()
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
