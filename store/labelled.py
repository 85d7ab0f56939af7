"""Stored maps as labelled `xarray` objects, for notebooks (xarray is the optional `xarray` extra).

`labelled_attention` gives one example as a DataArray with dims (layer, head, query, key) and
the tokens as coordinates; `labelled_run` gives several examples as a Dataset with one
variable per example (examples differ in length, so they cannot share one padded array
without inventing values). Layers and heads are 0-based coordinates, as everywhere in data.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .store import Store

DIMS = ("layer", "head", "query", "key")


def _xarray() -> Any:
    try:
        import xarray
    except ImportError:
        raise InvalidArgumentError("labelled arrays need xarray: pip install 'attnstore[xarray]'") from None
    return xarray


def _selected(value, n: int) -> list[int]:
    if value is None:
        return list(range(n))
    return [int(value)] if isinstance(value, int) else [int(v) for v in value]


def labelled_attention(store: Store, run, example: int, layer=None, head=None) -> Any:
    """One example's maps as an xarray.DataArray: dims (layer, head, query, key); coordinates layer and
    head (0-based), query/key token positions, and along query and key the token, whether it is special,
    its word position and segment. Attributes name the run, model, dataset and example."""
    xr = _xarray()
    info = store.run_info(run)
    maps = store.attention(run, example, layer=layer, head=head)
    tokens = store.tokens(run, example)
    positions = tokens["position"].to_numpy()
    per_token = dict(
        token=tokens["token"].astype(str).to_numpy(),
        is_special=tokens["is_special"].astype(bool).to_numpy(),
        word_position=tokens["word_position"].astype("float64").to_numpy(),
        segment=tokens["segment"].astype(int).to_numpy(),
    )
    coords: dict[str, Any] = dict(layer=_selected(layer, info.n_layers), head=_selected(head, info.n_heads), query=positions, key=positions)
    for axis in ("query", "key"):
        for name, values in per_token.items():
            coords[f"{axis}_{name}"] = (axis, values)
    return xr.DataArray(
        maps,
        dims=DIMS,
        coords=coords,
        name="attention",
        attrs=dict(
            run=info.name,
            model=info.model,
            dataset=f"{info.dataset}:{info.split}",
            example=int(example),
            dtype=info.dtype,
            description="attention of each query token (row) to each key token (column); rows sum to 1",
        ),
    )


def labelled_run(store: Store, run, examples: Iterable[int] | None = None, layer=None, head=None) -> Any:
    """Several examples (default: every stored one) as an xarray.Dataset, one DataArray per example named
    `example_N`, each with its own query/key lengths."""
    xr = _xarray()
    if examples is None:
        frame = store.examples(run, texts=False)
        examples = frame.loc[~frame["skipped"], "example"].tolist()
    arrays = {}
    for e in (int(e) for e in examples):
        one = labelled_attention(store, run, e, layer=layer, head=head)
        per_example = [name for name in one.coords if name.startswith(("query", "key"))]  # their length is the example's
        arrays[f"example_{e}"] = one.rename({name: f"{name}_{e}" for name in per_example})
    info = store.run_info(run)
    return xr.Dataset(arrays, attrs=dict(run=info.name, model=info.model, dataset=f"{info.dataset}:{info.split}"))
