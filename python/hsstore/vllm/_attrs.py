"""Reading vLLM objects whose shape differs between model classes and engine layers."""

from typing import Any, Iterable, Optional


def first_attribute(obj: Any, paths: Iterable[str]) -> Optional[Any]:
    """The first of the dotted attribute `paths` that `obj` has (not None), else None:
    first_attribute(llm, ("llm_engine.vllm_config", "vllm_config"))."""
    for path in paths:
        found: Any = obj
        for name in path.split("."):
            found = getattr(found, name, None)
            if found is None:
                break
        if found is not None:
            return found
    return None
