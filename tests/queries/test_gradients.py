"""C3 gradients: refused for a model without a masked-LM head; computed for one that has it."""

import numpy as np
import pytest

from attnstore.ingest import ingest
from attnstore.queries.gradients import gradient_importance
from attnstore.store.errors import InvalidArgumentError

pytestmark = pytest.mark.model


def test_default_model_has_no_mlm_head(store, loaded_model, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("One sentence here.\n", encoding="utf-8")
    run = ingest(store, corpus=str(corpus), fmt="text", annotator="whitespace", loaded=loaded_model, progress=False).run
    import logging

    from transformers.utils import logging as hf_logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    hf_logging.get_logger().addHandler(handler)  # transformers' library logger (it does not propagate)
    try:
        with pytest.raises(InvalidArgumentError, match="has no masked-LM head"):
            gradient_importance(store, run.name)
    finally:
        hf_logging.get_logger().removeHandler(handler)
    # transformers' "Some weights ... were not initialized" is not printed before attnstore's one line
    assert not [r for r in records if "not initialized" in r.getMessage()]


def test_gradients_of_a_small_mlm(store, loaded_model, tmp_path):
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=loaded_model.tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    path = tmp_path / "tiny-mlm"
    BertForMaskedLM(config).save_pretrained(path)
    loaded_model.tokenizer.save_pretrained(path)
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat on the mat, then slept.\nDogs bark.\n", encoding="utf-8")
    run = ingest(store, corpus=str(corpus), fmt="text", annotator="whitespace", model=str(path), progress=False).run
    frame = gradient_importance(store, run.name, seed=1)
    assert frame.shape == (4, 6) and list(frame.columns[2:]) == ["to_cls", "to_sep", "to_punct", "to_other"]
    values = frame[["to_cls", "to_sep", "to_punct", "to_other"]].to_numpy()
    assert np.isfinite(values).all() and (values > 0).all()
    assert np.allclose(frame.to_numpy(), gradient_importance(store, run.name, seed=1).to_numpy())  # seeded
    store.save_head_metrics(run.name, frame, prefix="gradient")
    pytest.importorskip("matplotlib")
    from attnstore.api.report import clark_report

    readme = clark_report(store, run.name, str(tmp_path / "report"), min_count=1).read_text(encoding="utf-8")
    assert "![Fig. 3](fig3_gradients.png)" in readme
    assert (tmp_path / "report" / "fig3_gradients.svg").exists()
