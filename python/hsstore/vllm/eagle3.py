"""EAGLE-3's auxiliary hidden states in vLLM's own terms: which target-model layers a vLLM EAGLE-3
draft reads, as hsstore.vllm storage labels.

vLLM numbers an auxiliary layer id ``i`` as the residual stream *entering* decoder layer ``i``:
``EagleModelMixin._maybe_add_hidden_state`` (vllm/model_executor/models/interfaces.py) appends
``hidden_states + residual`` after decoder layer ``i - 1`` (LlamaModel.forward calls it with
``idx + 1``), and id 0 is the embeddings (before layer 0). The transformers backend says the same
("layer - 1 because we want the input to the layer"). hsstore's label ``k`` is the residual
stream after decoder layer ``k`` (``hidden + residual`` of ``model.layers[k]``,
hsstore.vllm.layers), so vLLM's aux id ``i`` is hsstore's label ``i - 1``, the same tensor bit for
bit (the same ``hidden + residual`` sum of the same two tensors). Id 0 (the embeddings) has no hsstore label
and is refused.

Which ids (vLLM 0.32, GPUModelRunner._setup_eagle3_aux_hidden_state_outputs, shared by the CPU
runner):

1. the draft's config, ``eagle_aux_hidden_state_layer_ids`` (or ``eagle_config`` /
   ``dflash_config`` inside it): GPUModelRunner._get_eagle3_aux_layers_from_config, called here
   as it is;
2. else the target model's ``get_eagle3_default_aux_hidden_state_layers()`` (SupportsEagle3):
   ``(2, N // 2, N - 3)`` for N decoder layers unless the model overrides it.

vLLM keeps them sorted and unique (EagleModelMixin._set_aux_hidden_state_layers), and so does this
module. In a worker the capture checks the ids again against the live model (vLLM's own calls on
the loaded model, and the layers vLLM actually set when a draft runs): a mismatch fails attach().
"""

from __future__ import annotations

import types
from typing import Any, List, Optional, Sequence, Tuple

# The layer spec that stands for "the layers vLLM's EAGLE-3 draft reads" (hsstore.vllm.layers).
from ._attrs import first_attribute
from .layers import EAGLE3

__all__ = ["EAGLE3", "aux_ids_to_labels", "eagle3_aux_layer_ids", "eagle3_layers",
           "expand_specs", "live_aux_layer_ids"]



def _config_of(source: Any) -> Any:
    """A VllmConfig from a VllmConfig, an LLM, an LLMEngine or a model runner."""
    config = first_attribute(source, ("llm_engine.vllm_config", "vllm_config"))
    if config is not None:
        return config
    if hasattr(source, "model_config") and hasattr(source, "parallel_config"):
        return source
    raise TypeError(f"hsstore.vllm.eagle3: expected a VllmConfig or a vllm.LLM, got "
                    f"{type(source).__name__}")


def _ids_from_speculative_config(speculative_config: Any) -> Optional[Tuple[int, ...]]:
    """vLLM's own reading of the draft's config (GPUModelRunner._get_eagle3_aux_layers_from_config
    only reads self.speculative_config)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    holder = types.SimpleNamespace(speculative_config=speculative_config)
    return GPUModelRunner._get_eagle3_aux_layers_from_config(holder)


def _default_ids(vllm_config: Any) -> Tuple[int, ...]:
    """The target model class's SupportsEagle3 default, from the config alone (no weights): the
    method runs on a stand-in holding the model's decoder layer count."""
    from vllm.model_executor.model_loader.utils import get_model_architecture
    from vllm.model_executor.models.interfaces import SupportsEagle3, supports_eagle3

    model_config = vllm_config.model_config
    model_cls, arch = get_model_architecture(model_config)
    if not supports_eagle3(model_cls):
        raise ValueError(f"hsstore.vllm: {arch} does not support EAGLE-3 in vLLM (SupportsEagle3): "
                         "name the layers instead")
    num_layers = model_config.get_total_num_hidden_layers()
    inner = types.SimpleNamespace(layers=[None] * num_layers)
    stand_in = types.SimpleNamespace(
        model=inner, text_config=types.SimpleNamespace(num_hidden_layers=num_layers))
    try:
        return tuple(model_cls.get_eagle3_default_aux_hidden_state_layers(stand_in))
    except (AttributeError, AssertionError, TypeError):
        # An override that needs the loaded model (a multimodal wrapper delegating to its
        # language model): vLLM's generic default; attach() checks it against the live model.
        return tuple(SupportsEagle3.get_eagle3_default_aux_hidden_state_layers(stand_in))


def eagle3_aux_layer_ids(source: Any) -> Tuple[int, ...]:
    """vLLM's EAGLE-3 auxiliary layer ids for `source` (a VllmConfig or a vllm.LLM), in vLLM's
    numbering (id i = the residual stream entering decoder layer i), sorted and unique: the
    speculative config's draft ids if it names them, else the target model's default."""
    config = _config_of(source)
    ids = None
    if getattr(config, "speculative_config", None) is not None:
        ids = _ids_from_speculative_config(config.speculative_config)
    if not ids:
        ids = _default_ids(config)
    return tuple(sorted(set(int(i) for i in ids)))


def aux_ids_to_labels(ids: Sequence[int], num_layers: int) -> List[int]:
    """hsstore labels of vLLM aux ids: id i -> label i - 1 (the output of decoder layer i - 1)."""
    labels = []
    for i in ids:
        if i == 0:
            raise ValueError("hsstore.vllm: EAGLE-3 aux layer id 0 is the embeddings (the input "
                             "of decoder layer 0), which hsstore does not capture")
        if not 1 <= i <= num_layers:
            raise ValueError(f"hsstore.vllm: EAGLE-3 aux layer id {i} is out of range for a "
                             f"model with {num_layers} decoder layers")
        labels.append(i - 1)
    return labels


def eagle3_layers(source: Any, *, final: bool = False) -> List[int]:
    """The hsstore.vllm labels of the layers vLLM's EAGLE-3 would read for `source` (a VllmConfig
    or a vllm.LLM), in vLLM's order; with ``final=True`` the final state (-1) after them. Pass
    the result as HiddenStates(layers=...), or write ``layers="eagle3"`` (or ``["eagle3",
    "final"]``) and let the connector resolve it against the engine's own config."""
    config = _config_of(source)
    labels = aux_ids_to_labels(eagle3_aux_layer_ids(config),
                               config.model_config.get_total_num_hidden_layers())
    return labels + [-1] if final else labels


def expand_specs(specs: Sequence[Any], vllm_config: Any) -> List[Any]:
    """`specs` with every "eagle3" replaced by eagle3_layers(vllm_config), in place."""
    if EAGLE3 not in specs:
        return list(specs)
    out: List[Any] = []
    for spec in specs:
        out.extend(eagle3_layers(vllm_config) if spec == EAGLE3 else [spec])
    return out


def live_aux_layer_ids(model_runner: Any) -> Tuple[int, ...]:
    """The ids vLLM uses in a worker (GPUModelRunner._setup_eagle3_aux_hidden_state_outputs): the
    layers vLLM set on the model when a draft reads them (not those hsstore set for itself),
    else vLLM's own resolution on the loaded model (draft config, then the model's default)."""
    model = model_runner.get_model() if hasattr(model_runner, "get_model") else model_runner.model
    # Aux outputs hsstore turned on for its own layers (hsstore.vllm.aux_outputs) are not a draft's.
    hsstore_aux = getattr(model_runner, "_hsstore_aux", None)
    if getattr(model_runner, "use_aux_hidden_state_outputs", False) and not (
            hsstore_aux is not None and hsstore_aux.owned):
        holder = model
        if hasattr(model, "get_language_model"):
            holder = model.get_language_model()
        holder = getattr(holder, "model", holder)
        ids = getattr(holder, "aux_hidden_state_layers", ())
        if ids:
            return tuple(ids)
    ids = model_runner._get_eagle3_aux_layers_from_config()
    if not ids:
        ids = model.get_eagle3_default_aux_hidden_state_layers()
    return tuple(sorted(set(int(i) for i in ids)))
