"""`attnstore saliency`: gradient x input of a fine-tuned classifier's prediction per stored token, equal to the same
gradient taken one example at a time; resumable; refused for a model that is not a classifier of the store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

FIXTURES = str(Path(__file__).parents[1] / "fixtures" / "data")
pytestmark = pytest.mark.one_backend


@pytest.fixture
def tuned_run(store, tiny_bert):
    from attnstore.ingest import ingest
    from attnstore.ingest.finetune import finetune

    tuned = finetune(store, task="SST-2", model=tiny_bert, epochs=1, batch_size=2, seed=0, data_dir=FIXTURES, progress=False)
    ingest(store, dataset="glue/SST-2:dev", data_dir=FIXTURES, model=tuned.name, name="tuned", progress=False)
    return tuned.name


def one_at_a_time(store, model: str, run: str, example: int) -> np.ndarray:
    from attnstore.ingest.saliency import _classifier

    classifier = _classifier(store, model)
    toks = store.tokens(run, example)
    embedded = []

    def keep(_module, _args, out):
        out.retain_grad()
        embedded.append(out)

    handle = classifier.get_input_embeddings().register_forward_hook(keep)
    try:
        ids = torch.tensor([toks["token_id"].to_list()])
        logits = classifier(input_ids=ids, token_type_ids=torch.tensor([toks["segment"].to_list()])).logits[0]
        logits.softmax(-1)[logits.argmax()].backward()
    finally:
        handle.remove()
    return (embedded[0].grad * embedded[0]).sum(-1)[0].detach().numpy()


def test_saliency_equals_the_gradient_of_each_example_alone(store, tuned_run):
    from attnstore.ingest.saliency import compute_saliency

    meta = compute_saliency(store, "tuned", batch_size=2)
    assert meta["complete"] and meta["method"] == "grad_x_input" and meta["n_examples"] == store.n_committed("tuned")
    got = dict(store.iter_saliency("tuned"))
    for example in (0, 3):
        np.testing.assert_allclose(got[example], one_at_a_time(store, tuned_run, "tuned", example), rtol=1e-4, atol=1e-7)
    assert compute_saliency(store, "tuned") == meta  # done: nothing recomputed
    # signed, as the help says: the product's sign is kept (attention_attribution takes |.| by default)
    assert meta["target"].startswith("predicted class probability")
    values = np.concatenate(list(got.values()))
    assert (values < 0).any() and (values > 0).any()


def test_the_help_says_what_is_stored():
    from click.testing import CliRunner

    from attnstore.api.cli import main

    text = " ".join(CliRunner().invoke(main, ["saliency", "--help"]).output.split())
    assert "signed" in text and "predicted-class probability" in text and "logit" not in text and "|grad" not in text


def test_an_interrupted_computation_resumes_to_the_same_values(store, tuned_run, monkeypatch):
    from attnstore.ingest import saliency
    from attnstore.store import arrays

    full = dict(store.iter_saliency("tuned")) if store.saliency_info("tuned") else None
    calls = {"n": 0}
    real = arrays.TokenArray.write

    def cut_off(self, start, values):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(self, start, values)

    monkeypatch.setattr(arrays.TokenArray, "write", cut_off)
    with pytest.raises(KeyboardInterrupt):
        saliency.compute_saliency(store, "tuned", batch_size=2)
    meta = store.saliency_info("tuned")
    assert not meta["complete"] and meta["n_examples"] == 2
    monkeypatch.setattr(arrays.TokenArray, "write", real)
    saliency.compute_saliency(store, "tuned", batch_size=2)
    resumed = dict(store.iter_saliency("tuned"))
    assert full is None or all(np.array_equal(full[e], resumed[e]) for e in full)
    straight = {e: one_at_a_time(store, tuned_run, "tuned", e) for e in (0, 2, 4)}
    for e, values in straight.items():
        np.testing.assert_allclose(resumed[e], values, rtol=1e-4, atol=1e-7)


def test_a_run_of_a_base_model_is_refused_in_one_line(store, tiny_bert):
    from attnstore.ingest import ingest
    from attnstore.ingest.saliency import compute_saliency
    from attnstore.store.errors import InvalidArgumentError

    ingest(store, dataset="glue/SST-2:dev", data_dir=FIXTURES, model=tiny_bert, name="base", progress=False)
    with pytest.raises(InvalidArgumentError, match="is not a classifier fine-tuned in this store") as err:
        compute_saliency(store, "base")
    assert "\n" not in str(err.value)
