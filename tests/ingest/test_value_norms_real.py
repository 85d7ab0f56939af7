"""Value norms stored by a real ingest equal ||f_h(x_j)|| computed directly from the model's modules (Kobayashi et al.
2020: the value vector, value bias included, through head h's columns of the output projection, output bias not)."""

from __future__ import annotations

import numpy as np
import pytest

from attnstore.queries import run_query

pytestmark = pytest.mark.model


def direct_norms(loaded, token_ids, segments) -> np.ndarray:
    """(layer, head, key) from each layer's input hidden states, as the reference code's BertSelfAttention does."""
    import torch

    model = loaded.model
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([list(token_ids)]), token_type_ids=torch.tensor([list(segments)]), output_hidden_states=True)
        norms = []
        for layer, block in enumerate(model.encoder.layer):
            value = block.attention.self.value(out.hidden_states[layer])[0]  # (token, hidden), bias included
            w_out = block.attention.output.dense.weight  # (hidden out, hidden in)
            d = value.shape[-1] // loaded.n_heads
            per_head = [
                torch.linalg.norm(value[:, h * d : (h + 1) * d] @ w_out[:, h * d : (h + 1) * d].T, dim=-1) for h in range(loaded.n_heads)
            ]
            norms.append(torch.stack(per_head))
    return torch.stack(norms).numpy()


def test_stored_norms_equal_the_direct_computation(real_runs):
    store = real_runs("mrpc")
    assert store.has_value_norms("mrpc")
    for example in (0, 3):
        toks = store.tokens("mrpc", example)
        stored = store.value_norms("mrpc", example)
        expected = direct_norms(real_runs.loaded, toks["token_id"], toks["segment"])
        assert stored.shape == expected.shape == (6, 12, len(toks))
        np.testing.assert_allclose(stored, expected, rtol=2e-3, atol=1e-3)  # float16 storage


def test_norm_weighted_special_token_shares_are_a_distribution(real_runs):
    store = real_runs("mrpc")
    frame = run_query(store, "special_tokens", run="mrpc", weights="norm")
    shares = frame[["to_cls", "to_sep", "to_punct", "to_other"]].sum(axis=1).to_numpy()
    np.testing.assert_allclose(shares, 1.0, atol=1e-5)
    plain = run_query(store, "special_tokens", run="mrpc")
    # the heads that attend to [CLS] most give it a smaller share once each key's value norm is counted (the paper's
    # finding for BERT's special tokens, here for this model's [CLS] sink)
    top = plain["to_cls"].nlargest(5).index
    assert (frame.loc[top, "to_cls"] < plain.loc[top, "to_cls"]).all()
