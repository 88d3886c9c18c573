"""qhead.vllm: a vLLM plugin that serves a model's token tables (embedding / lm_head) from one
packed qhead table.

vLLM finds it through the ``vllm.general_plugins`` entry point ``qhead = qhead.vllm:register``
and calls :func:`register` in every process it starts. ``--quantization qhead`` (or a model whose
``quantization_config`` says ``"quant_method": "qhead"``) then gives the embedding and the head
qhead's method; every other layer stays vLLM's own. See docs/vllm.md.

The parts that decide what is quantized and how the weights are laid out and loaded
(:mod:`qhead.vllm.config`, :mod:`qhead.vllm.table`) import no vLLM.
"""
from __future__ import annotations

__all__ = ["register", "registered"]

_registered = False


def register() -> None:
    """Registers the "qhead" quantization config with vLLM (idempotent: later calls in the same
    process do nothing). Raises ImportError when vLLM is not importable."""
    global _registered
    if _registered:
        return
    from . import _plugin  # noqa: F401  (its import registers the config)
    _registered = True


def registered() -> bool:
    """Whether register() has run in this process."""
    return _registered
