"""Capture that keeps torch.compile and CUDA graphs: the layers come from vLLM's auxiliary
hidden-state outputs (the mechanism EAGLE-3 and ``extract_hidden_states`` use), the final state
from the model's output.

Why not hooks: a forward hook runs only where Python calls the module. vLLM compiles the decoder
stack into one graph (torch.compile inlines the layers) and replays CUDA graphs, so a decoder
layer's hook never fires there. A model implementing vLLM's ``SupportsEagle3`` returns, beside the
final state, ``hidden + residual`` after the layers named by ``set_aux_hidden_state_layers``
(``EagleModelMixin._maybe_add_hidden_state``): those tensors are outputs of the compiled graph and
of every captured CUDA graph, so they exist in every mode. vLLM's aux id ``i`` is hsstore's label
``i - 1`` (hsstore.vllm.eagle3), the same sum of the same two tensors.

When: vLLM compiles once, on the model's first forward (its memory profiling, before it builds the
KV connector), and drops every Dynamo guard, so aux layers set later never reach the graph.
They are set where vLLM sets its own, at the end of the model runner's ``load_model``
(``GPUModelRunner._setup_eagle3_aux_hidden_state_outputs``, shared by the CPU runner):
:func:`install` wraps that method, for runners whose KV connector is hsstore's. ``install()`` runs when
``hsstore.vllm`` is imported; a worker imports it before its model loads where vLLM resolves
``worker_extension_cls="hsstore.vllm.WorkerExtension"`` (``HiddenStates.llm_kwargs()`` passes it;
``vllm serve --worker-extension-cls hsstore.vllm.WorkerExtension``) or loads the
``vllm.general_plugins`` entry point of an installed hsstore. ``install()`` imports nothing of vLLM:
it patches the runner module when that is imported.

What hsstore turns on: the aux ids of its decoder-layer labels, and ``use_aux_hidden_state_outputs``
(the runner then unpacks ``(hidden, aux)``; with no draft nothing else reads ``aux``). Where vLLM's
EAGLE-3 draft already reads aux outputs, hsstore adds none (the draft's input is the concatenation
of exactly its layers): the labels among the draft's layers come from them, the rest need hooks.
The compile cache key: vLLM's key covers no KV-connector field, so the aux ids go into
``additional_config`` (hashed into the key), else a graph compiled with the outputs would be loaded
by an engine without them, or the reverse.

Per forward the wrapped ``_model_forward`` keeps a reference to the output (no copy, no wait); the
capture copies its rows after the forward (PromptCapture.end_step), on the engine's stream.

Models that need ``enforce_eager=True`` for intermediate layers: those without ``SupportsEagle3``
(``vllm.model_executor.models.interfaces.supports_eagle3(model)`` is False), pipeline parallelism,
and any worker where hsstore.vllm was not imported before the model loaded.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .layers import FINAL

__all__ = ["AuxOutputs", "install", "reason_unavailable"]

logger = logging.getLogger("hsstore.vllm")

_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
_CONNECTOR_MODULES = ("hsstore.vllm.connector", "hsstore.vllm.mp_connector")
CACHE_KEY = "hsstore.aux_hidden_state_layers"  # in additional_config: the compile cache key


class AuxOutputs:
    """What one model runner returns for hsstore: the final state and the aux layers `ids`
    (vLLM's numbering, sorted), and the latest forward's output."""

    def __init__(self, ids: Sequence[int], owned: bool) -> None:
        self.ids: Tuple[int, ...] = tuple(ids)
        self.owned = owned  # hsstore turned these outputs on (no draft of vLLM's reads them)
        self.last: Any = None
        self.forwards = 0

    @property
    def labels(self) -> List[int]:
        """The hsstore labels these outputs hold: every aux layer, and the final state."""
        return [i - 1 for i in self.ids if i >= 1] + [FINAL]

    def record(self, output: Any) -> None:
        self.last = output
        self.forwards += 1

    def take(self) -> Optional[Dict[int, Any]]:
        """The latest forward's tensors by label (references, no copy); None if no forward ran
        since the last take()."""
        output, self.last = self.last, None
        if output is None:
            return None
        if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], list):
            hidden, aux = output
        else:
            hidden, aux = output, []
        if len(aux) != len(self.ids):
            raise RuntimeError(f"hsstore.vllm: the model returned {len(aux)} auxiliary hidden "
                               f"states, expected {len(self.ids)} (aux layers {self.ids})")
        tensors = {FINAL: hidden}
        for i, tensor in zip(self.ids, aux):
            if i >= 1:
                tensors[i - 1] = tensor
        return tensors


def _hsstore_specs(vllm_config: Any) -> Optional[List[Any]]:
    """The layer specs of hsstore's connector in `vllm_config`, None for another connector."""
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    if transfer is None or getattr(transfer, "kv_connector_module_path", None) not in \
            _CONNECTOR_MODULES:
        return None
    from .connector_keys import option
    from .layers import check_specs

    extra = transfer.kv_connector_extra_config or {}
    return check_specs(option(extra, "hsstore.layers"))


def reason_unavailable(runner: Any) -> Optional[str]:
    """Why this runner's model cannot return aux outputs for hsstore (None: it can)."""
    from vllm.distributed.parallel_state import get_pp_group
    from vllm.model_executor.models.interfaces import supports_eagle3

    model = runner.get_model()
    if not supports_eagle3(model):
        return (f"{type(model).__name__} does not implement vLLM's SupportsEagle3 (it has no "
                "auxiliary hidden-state outputs)")
    if get_pp_group().world_size > 1:
        return "pipeline parallelism splits the layers over ranks"
    additional = runner.vllm_config.additional_config
    if not isinstance(additional, dict):
        return ("vLLM's additional_config is not a dict, so the compile cache key cannot tell "
                "a graph with aux outputs apart")
    return None


def _enable(runner: Any) -> None:
    """After vLLM's own aux setup: hsstore's aux layers on, and the output kept per forward."""
    specs = _hsstore_specs(runner.vllm_config)
    if specs is None:
        return
    reason = reason_unavailable(runner)
    if reason is not None:
        runner._hsstore_aux_reason = reason
        logger.info("hsstore.vllm: layers are captured with forward hooks: %s", reason)
        return
    from .capture import decoder_layers_of
    from .eagle3 import expand_specs, live_aux_layer_ids
    from .layers import resolve_layers

    model = runner.get_model()
    labels = resolve_layers(expand_specs(specs, runner.vllm_config), len(decoder_layers_of(model)))
    if runner.use_aux_hidden_state_outputs:  # vLLM's EAGLE-3 (or DFlash) draft reads them
        aux = AuxOutputs(live_aux_layer_ids(runner), owned=False)
    else:
        aux = AuxOutputs(sorted({label + 1 for label in labels if label != FINAL}), owned=True)
        if aux.ids:
            runner.vllm_config.additional_config[CACHE_KEY] = list(aux.ids)
            model.set_aux_hidden_state_layers(aux.ids)
            runner.use_aux_hidden_state_outputs = True
    forward = runner._model_forward

    def model_forward(*args: Any, **kwargs: Any) -> Any:
        output = forward(*args, **kwargs)
        aux.record(output)
        return output

    runner._model_forward = model_forward
    runner._hsstore_aux = aux
    logger.info("hsstore.vllm: layers %s come from vLLM's auxiliary hidden-state outputs "
                "(aux layers %s%s)", [label for label in labels if label in aux.labels],
                list(aux.ids), "" if aux.owned else ", the EAGLE-3 draft's")


def _patch(module: Any) -> None:
    runner_cls = module.GPUModelRunner
    original = runner_cls._setup_eagle3_aux_hidden_state_outputs
    if getattr(original, "_hsstore", False):
        return

    def setup(self: Any) -> None:
        original(self)
        _enable(self)

    setup._hsstore = True  # type: ignore[attr-defined]
    setup.__wrapped__ = original  # type: ignore[attr-defined]
    runner_cls._setup_eagle3_aux_hidden_state_outputs = setup


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches vLLM's model runner module when it is imported (install() imports none of vLLM:
    a frontend process must not load the worker's modules early)."""

    def __init__(self) -> None:
        self._finding = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _RUNNER_MODULE or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


_FINDER = _PatchOnImport()


def install() -> None:
    """Makes every vLLM model runner of this process whose connector is hsstore's return
    hsstore's layers as aux outputs (idempotent; also the vllm.general_plugins entry point)."""
    module = sys.modules.get(_RUNNER_MODULE)
    if module is not None:
        _patch(module)
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
