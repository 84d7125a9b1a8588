"""Which activations a capture keeps: the one rule that turns what a user writes into storage
labels (the ``layer_idx`` of every store and restore).

A model with N decoder layers has N + 1 hidden states a consumer may want:

==========================  ===============================================  =============
written as                  the hidden state                                 stored as
==========================  ===============================================  =============
``-1`` or ``"final"``       the model's output, after the final norm (what   ``-1``
                            the LM head reads)
``k`` (0 <= k < N)          the residual stream after decoder layer k        ``k``
                            (``hidden + residual`` of ``model.layers[k]``)
``-j`` (2 <= j <= N + 1)    counted from the end of [layer 0, ..., layer     ``N + 1 - j``
                            N - 1, final]: -2 is the last decoder layer
``"eagle3"``                the layers vLLM's EAGLE-3 draft reads (its aux   vLLM's aux id
                            hidden states, hsstore.vllm.eagle3): resolved    ``i`` as
                            against the engine's config by the connector     ``i - 1``
==========================  ===============================================  =============

Labels are canonical: ``-2`` and ``N - 1`` are one slot, so keys never depend on the spelling.
Every listed layer is required: a prefix counts as cached only where all of them are (all or
nothing).
"""

from __future__ import annotations

from typing import Iterable, List, Sequence, Union

__all__ = ["EAGLE3", "FINAL", "LayerSpec", "resolve_layers"]

FINAL = -1
EAGLE3 = "eagle3"  # expanded by hsstore.vllm.eagle3.expand_specs (it needs the vLLM config)
LayerSpec = Union[int, str]


def _one(spec: LayerSpec, num_layers: int) -> int:
    if isinstance(spec, str):
        if spec == "final":
            return FINAL
        if spec == EAGLE3:
            raise ValueError("layers: 'eagle3' is resolved against the vLLM config "
                             "(hsstore.vllm.eagle3.expand_specs) before the layer count")
        raise ValueError(f"layers: expected an int, 'final' or 'eagle3', got {spec!r}")
    if isinstance(spec, bool) or not isinstance(spec, int):
        raise ValueError(f"layers: expected an int or 'final', got {spec!r}")
    if spec == FINAL:
        return FINAL
    if 0 <= spec < num_layers:
        return spec
    if -(num_layers + 1) <= spec <= -2:
        return num_layers + 1 + spec
    raise ValueError(
        f"layers: {spec} is out of range for a model with {num_layers} decoder layers "
        f"(0..{num_layers - 1}, -1 = final, -2..-{num_layers + 1} from the end)"
    )


def resolve_layers(specs: Iterable[LayerSpec], num_layers: int) -> List[int]:
    """Canonical storage labels for `specs` (duplicates merged, order kept). ValueError naming
    the entry for anything out of range, and for an empty list."""
    if num_layers <= 0:
        raise ValueError(f"num_layers must be > 0, got {num_layers}")
    labels: List[int] = []
    for spec in specs:
        label = _one(spec, num_layers)
        if label not in labels:
            labels.append(label)
    if not labels:
        raise ValueError("layers: at least one layer is needed (e.g. [-1] for the final state)")
    return labels


def check_specs(specs: Union[LayerSpec, Sequence[LayerSpec]]) -> List[LayerSpec]:
    """The checks that need no model (types, emptiness), for configuration time. A single spec
    stands for a list of one (``layers="eagle3"``)."""
    out = [specs] if isinstance(specs, (str, int)) else list(specs)
    if not out:
        raise ValueError("layers: at least one layer is needed (e.g. [-1] for the final state)")
    for spec in out:
        if isinstance(spec, bool) or not isinstance(spec, (int, str)):
            raise ValueError(f"layers: expected an int, 'final' or 'eagle3', got {spec!r}")
        if isinstance(spec, str) and spec not in ("final", EAGLE3):
            raise ValueError(f"layers: expected an int, 'final' or 'eagle3', got {spec!r}")
    return out
