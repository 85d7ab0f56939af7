"""Fixtures of the ingest tests: tiny random decoders saved once per module (tests/ingest/test_decoders.py `build`);
the one-process run that distributed ingests are compared with."""

from pathlib import Path

import pytest

# The reference run of the distributed ingests (tests/ingest/test_dask_ingest.py, test_workers.py), which use the
# same corpus and options.
MRPC_HEAD = Path(__file__).parents[1] / "fixtures" / "mrpc_dev_head.tsv"
PARTS_OPTIONS = dict(fmt="pairs-tsv", annotator="whitespace", batch_size=2, chunk_cells=4096, progress=False)


@pytest.fixture(scope="session")
def one_process(tmp_path_factory, tiny_bert):
    """The tiny BERT's run "k" of the MRPC excerpt, ingested in one process (SQLite)."""
    from attnstore.ingest import ingest
    from attnstore.store import migrate, open_store

    folder = tmp_path_factory.mktemp("one-process")
    url = f"sqlite:///{folder / 'meta.sqlite'}"
    migrate.upgrade(url)
    store = open_store(db=url, root=str(folder / "attention.zarr"))
    ingest(store, corpus=str(MRPC_HEAD), model=tiny_bert, name="k", **PARTS_OPTIONS)
    return store


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache: dict[str, str] = {}

    def get(arch: str) -> str:
        if arch not in cache:
            from attnstore.tests.ingest.test_decoders import build

            cache[arch] = build(arch, tmp_path_factory.mktemp(arch))
        return cache[arch]

    return get
