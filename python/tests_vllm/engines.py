"""Real vLLM engines for the e2e tests and the benchmark: a tiny dummy-weight Llama written to a
local directory (no download, no tokenizer), its weights re-initialised from a seed to an O(1)
scale, and helpers to build, run and tear down an LLM with hsstore.vllm installed."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import pathlib
from typing import Any, Dict, Iterator, List, Optional, Sequence

TINY = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1000}
# The benchmark's larger CPU-feasible model.
MEDIUM = {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
          "num_key_value_heads": 8, "intermediate_size": 2816, "vocab_size": 4096}


def write_llama(directory: pathlib.Path, shape: Dict[str, int] = TINY,
                max_positions: int = 8192) -> pathlib.Path:
    """A Llama config.json (float32) vLLM can load with load_format='dummy'."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "max_position_embeddings": max_positions, "torch_dtype": "float32",
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, **shape}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def reinit_weights(worker: Any, seed: int) -> int:
    """collective_rpc target: every parameter from a seeded generator, at a scale that keeps
    activations O(1) (vLLM's dummy weights are U(-1e-3, 1e-3): near-zero activations, where a
    wrong row would hardly show). Norm weights 1. Identical in every process."""
    import torch

    model = worker.model_runner.model
    count = 0
    with torch.no_grad():
        for index, (name, param) in enumerate(sorted(model.named_parameters())):
            generator = torch.Generator().manual_seed(seed * 100003 + index)
            if "norm" in name:
                param.fill_(1.0)
            else:
                fan_in = param.shape[-1] if param.dim() > 1 else 1
                values = torch.randn(param.shape, generator=generator) / (fan_in ** 0.5)
                if "embed" in name:
                    values = torch.randn(param.shape, generator=generator)
                param.copy_(values.to(param.dtype))
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


@contextlib.contextmanager
def engine(model_dir: pathlib.Path, hs: Any, *, lmcache: Optional[Dict[str, Any]] = None,
           prefix_caching: bool = False, multiprocess: bool = False, executor: str = "uni",
           seed: int = 7, max_model_len: int = 4096, **llm_args: Any) -> Iterator[Any]:
    """An LLM with `hs` (hsstore.vllm.HiddenStates) installed; torn down on exit."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
    if multiprocess:
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # reinit_weights is a function
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    reset_lmcache_singletons()
    from vllm import LLM

    llm = LLM(model=str(model_dir), load_format="dummy", skip_tokenizer_init=True,
              enforce_eager=True, dtype="float32", max_model_len=max_model_len, seed=0,
              enable_prefix_caching=prefix_caching, distributed_executor_backend=executor,
              **hs.llm_kwargs(lmcache=lmcache), **llm_args)
    try:
        llm.collective_rpc(reinit_weights, args=(seed,))
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
             skip_prefix_cache: bool = False) -> List[Any]:
    """Greedy generation from token-id prompts, in order."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, detokenize=False,
                            skip_reading_prefix_cache=skip_prefix_cache or None)
    return llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                        use_tqdm=False)
