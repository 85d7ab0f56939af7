"""Massive activations (Sun et al. 2024, "Massive Activations in Large Language Models"): per token and layer, the
largest-magnitude entry of the layer's output hidden state, its dimension, and the median magnitude over dimensions.

Sun et al. find a few entries of the residual stream, at fixed dimensions and on the first token or delimiters,
thousands of times larger than the median, from an early layer on, and tie them to attention sinks. Keeping these three
numbers per token and layer (12 bytes each; the hidden state itself is 576 floats for SmolLM2) lets
`queries/massive_activations.py` find the peaks of a whole run and join them with `attention_sink`.

The outputs are caught by forward hooks on the decoder layers, reduced on the spot (a layer's hidden states are never
kept), per thread as ingest/norms.py catches value projections: two forward passes run at once on the shared model.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

_collecting = threading.local()  # .peaks: this thread's pass's per-layer peaks so far
_install_lock = threading.Lock()


def decoder_layers(model, n_layers: int) -> tuple[Any, ...] | None:
    """The decoder's layers in forward order (Llama-family `layers`, GPT-2's `h`), or None where not exactly n_layers."""
    for name in ("layers", "h"):
        layers = getattr(model, name, None)
        if layers is not None and len(layers) == n_layers:
            return tuple(layers)
    return None


def peaks_of(hidden) -> Any:
    """(batch, token, 3) float32 on the CPU: per token, the signed value of the largest-magnitude entry, its dimension and
    the median magnitude (torch's lower median)."""
    import torch

    values = hidden.detach().float()
    magnitude = values.abs()
    dim = magnitude.argmax(-1)
    signed = torch.gather(values, -1, dim.unsqueeze(-1)).squeeze(-1)
    if magnitude.device.type == "cpu":  # the same element by numpy's selection: 2.1 ms against torch's 14 ms (2,048 x 576)
        lower = (magnitude.shape[-1] - 1) // 2
        median = torch.from_numpy(np.partition(magnitude.numpy(), lower, axis=-1)[..., lower])
    else:
        median = magnitude.median(-1).values
    return torch.stack([signed, dim.float(), median], dim=-1).cpu()


def _catch(_module, _args, output):
    caught = getattr(_collecting, "peaks", None)
    if caught is not None:
        caught.append(peaks_of(output[0] if isinstance(output, tuple) else output))


def install(layers: tuple[Any, ...]) -> None:
    """The catching hooks, once per layer (a hook per pass would change a module's hook dict while another thread's
    pass iterates over it)."""
    with _install_lock:
        for layer in layers:
            if getattr(layer, "_attnstore_peak_hook", None) is None:
                layer._attnstore_peak_hook = layer.register_forward_hook(_catch)


class collecting:
    """`with collecting(layers) as peaks:` around a forward pass on this thread: `peaks` gets each layer's (batch,
    token, 3) peaks in forward order. `layers` None: nothing is caught."""

    def __init__(self, layers: tuple[Any, ...] | None):
        self.layers = layers
        self.peaks: list = []

    def __enter__(self) -> list:
        if self.layers is not None:
            install(self.layers)
            _collecting.peaks = self.peaks
        return self.peaks

    def __exit__(self, *exc) -> None:
        _collecting.peaks = None


def hidden_peaks(caught: list, n_layers: int, lengths: list[int]) -> list[np.ndarray]:
    """Per example, its (token, layer, 3) peaks for its first `length` tokens."""
    import torch

    if len(caught) != n_layers:
        raise RuntimeError(f"caught {len(caught)} decoder layer outputs, expected {n_layers} (one per layer)")
    stacked = torch.stack(caught, dim=2).numpy()  # (batch, token, layer, 3)
    return [stacked[k, :n] for k, n in enumerate(lengths)]


def peaks_manifest() -> dict:
    """The run manifest's `hidden_peaks` entry: what the run group's hidden_peak array holds."""
    from ..store import arrays

    return {"array": arrays.HIDDEN_PEAKS, "dtype": "float32", **arrays.HIDDEN_PEAKS_ATTRIBUTES}
