"""A run handle: one run's reads and queries without repeating its name.

>>> run = store.run("MRPC-dev-all-MiniLM-L6-v2")    # NotFoundError if there is no such run
>>> run.info.n_layers, run.examples(), run.tokens(0)
>>> run.attention(0, layer=5).shape                 # (1, head, query, key)
>>> run.query("entropy")                            # = run_query(store, "entropy", run=...)

The store imports nothing above it, so `RunHandle.query` calls the query runner installed with
`use_query_runner`: the package's root (attnstore/__init__.py, which every import of attnstore runs
first) installs `attnstore.queries.run_query`, imported when a query is first run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import AttnStoreError
from .records import RunInfo

if TYPE_CHECKING:  # annotations only: importing this module (attnstore/__init__.py does) loads neither
    import numpy as np
    import pandas as pd

    from .store import Store

# `runner(store, name, run=..., **params) -> DataFrame`: what `RunHandle.query` calls (see `use_query_runner`).
QueryRunner = Callable[..., Any]
_query_runner: QueryRunner | None = None


def use_query_runner(runner: QueryRunner) -> None:
    """Install the function `RunHandle.query` runs a query with, `runner(store, name, run=..., **params)`.

    attnstore/__init__.py installs `attnstore.queries.run_query` (the layers above the store wire it
    in; the store never imports them)."""
    global _query_runner
    _query_runner = runner


@dataclass(frozen=True)
class RunHandle:
    """A run of a store, found once by name or id: every method reads that run (by its id).

    `info` is the run's record when the handle was made; counts and status of a run still
    being written move on, so ask `store.run(...)` again for fresh ones.
    """

    store: Store
    info: RunInfo

    def __repr__(self) -> str:
        return f"RunHandle({self.info.name!r}, id={self.info.id}, {self.info.status}, {self.store!r})"

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def id(self) -> int:
        return self.info.id

    def examples(self) -> pd.DataFrame:
        """The run's examples (see `Store.examples`)."""
        return self.store.examples(self.info.id)

    def tokens(self, example: int) -> pd.DataFrame:
        """Tokens of one example with their word alignment and annotation (see `Store.tokens`)."""
        return self.store.tokens(self.info.id, example)

    def words(self, example: int) -> pd.DataFrame:
        """Words of one example (see `Store.words`)."""
        return self.store.words(self.info.id, example)

    def attention(
        self, example: int, layer: int | Iterable[int] | None = None, head: int | Iterable[int] | None = None, rows: range | None = None
    ) -> np.ndarray:
        """One example's maps as a (layer, head, query, key) array, or a block of its query `rows` (see `Store.attention`)."""
        return self.store.attention(self.info.id, example, layer=layer, head=head, rows=rows)

    def labelled_attention(self, example: int, layer=None, head=None) -> Any:
        """One example's maps as an xarray.DataArray with token coordinates (see `Store.labelled_attention`)."""
        return self.store.labelled_attention(self.info.id, example, layer=layer, head=head)

    def plot(self, example: int, layer: int | None = None, head: int | None = None) -> Any:
        """A matplotlib Figure of one example's maps (see `Store.plot`)."""
        return self.store.plot(self.info.id, example, layer=layer, head=head)

    def iter_attention(self, examples: Iterable[int] | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """Stream (example, maps) over the run with bounded memory (see `Store.iter_attention`)."""
        return self.store.iter_attention(self.info.id, examples)

    def value_norms(self, example: int) -> np.ndarray:
        """One example's value norms as a (layer, head, key) array (see `Store.value_norms`)."""
        return self.store.value_norms(self.info.id, example)

    def token_loss(self, example: int) -> np.ndarray:
        """One example's next-token loss per token, (token,) float32 nats (see `Store.token_loss`)."""
        return self.store.token_loss(self.info.id, example)

    def head_metrics(self, metric: str | None = None) -> pd.DataFrame:
        """Saved per-head values of this run (see `Store.head_metrics`)."""
        return self.store.head_metrics(self.info.id, metric)

    def query(self, name: str, **params: Any) -> pd.DataFrame:
        """Run the registered query `name` over this run: `attnstore.queries.run_query(store, name, run=..., **params)`."""
        if _query_runner is None:  # attnstore/__init__.py installs it; only a caller that removed it meets this
            raise AttnStoreError("no query runner is installed: call attnstore.store.handle.use_query_runner(attnstore.queries.run_query)")
        return _query_runner(self.store, name, run=self.info.name, **params)
