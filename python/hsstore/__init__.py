"""hsstore: a native hidden-state cache beside the KV cache, with LMCache's Python API.

Quick start::

    import hsstore, numpy as np
    config = hsstore.Config({"chunk_size": 256, "enable_hidden_state_cache": True,
                             "max_hidden_state_cpu_size": 0.5})
    engine = hsstore.Engine(config)
    store = engine.hidden_state_store
    tokens = list(range(512))
    store.store_hidden_states(tokens, np.ones((512, 1024), np.float32))  # -> 2
    store.retrieve_hidden_states(tokens)  # [512, 1024] float32 (torch if importable)

``hsstore.lmcache`` holds a drop-in replacement for LMCache's own ``HiddenStateStore``;
``hsstore.vllm`` captures and restores hidden states inside a real vLLM engine.
"""

from ._hsstore import (
    ActivationKind,
    CacheEngineKey,
    ChunkedTokenDatabase,
    Config,
    ConfigError,
    CoverageScope,
    Engine,
    Error,
    HiddenStateStore,
    InvalidArgument,
    LocalCpuBackend,
    Metadata,
    TokenDatabase,
)

__all__ = [
    "ActivationKind",
    "CacheEngineKey",
    "ChunkedTokenDatabase",
    "Config",
    "ConfigError",
    "CoverageScope",
    "Engine",
    "Error",
    "HiddenStateStore",
    "InvalidArgument",
    "LocalCpuBackend",
    "Metadata",
    "TokenDatabase",
]

__version__ = "0.1.0"
