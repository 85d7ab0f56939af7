"""Analyses that need the model itself find it on this machine, or say in one line how to point at it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest


def _info(store, make_run, source):
    make_run(store, [np.full((1, 1, 2, 2), 0.5, dtype=np.float32)], [["[CLS]", "[SEP]"]], name="src")
    info = store.run_info("src")
    return dataclasses.replace(info, manifest={**(info.manifest or {}), "model": {"source": source}})


def test_model_found_in_the_model_dir_the_recorded_folder_or_not_at_all(store, make_run, tmp_path, monkeypatch):
    from attnstore.queries.common import ENV_MODEL_DIR, model_source
    from attnstore.store.errors import NotFoundError

    monkeypatch.delenv(ENV_MODEL_DIR, raising=False)
    gone = str(tmp_path / "elsewhere" / "hand-src")  # the folder recorded on the machine that ingested
    info = _info(store, make_run, gone)
    with pytest.raises(NotFoundError, match=r"needs model 'hand-src', recorded at .*elsewhere.*pass --model-dir DIR"):
        model_source(store, info)
    here = tmp_path / "models-here" / "hand-src"
    here.mkdir(parents=True)
    (here / "config.json").write_text("{}", encoding="utf-8")
    assert model_source(store, info, str(tmp_path / "models-here")) == str(here)
    monkeypatch.setenv(ENV_MODEL_DIR, str(tmp_path / "models-here"))
    assert model_source(store, info) == str(here)
    monkeypatch.delenv(ENV_MODEL_DIR)
    recorded = tmp_path / "elsewhere" / "hand-src"
    recorded.mkdir(parents=True)
    (recorded / "config.json").write_text("{}", encoding="utf-8")
    assert model_source(store, info) == str(recorded)
    for hub_id in ("org/some-model", "bert-base-uncased"):  # a hub id is left to transformers' cache
        assert model_source(store, dataclasses.replace(info, manifest={"model": {"source": hub_id}})) == hub_id
