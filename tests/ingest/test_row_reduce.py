"""The CPU's compiled reduce of a Q/K ingest's rows (ingest/_rows.c through `RowStats.from_logits` and `reduce_logits`)
against torch's path (`RowStats.block` on weights softmaxed here), on hand-made logits: a right-padded batch, a sliding
window, learned sink logits, repeated token ids, blocks that do not divide the rows, and equal weights."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attnstore.ingest.row_stats import RowStats, reduce_logits  # noqa: E402
from attnstore.store import row_stats as fmt  # noqa: E402


def masked_logits(logits, lengths, window):
    """The causal rule the reduce applies: row i sees keys j <= i within its example's length and the window."""
    n = logits.shape[-1]
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    seen = (j <= i)[None] & (j[None] < torch.tensor(lengths)[:, None, None])
    if window:
        seen = seen & (i - j < window)[None]
    return logits.masked_fill(~seen[:, None], float("-inf"))


@pytest.mark.parametrize(("window", "with_sink"), [(None, False), (5, False), (None, True)])
def test_the_compiled_reduce_equals_torchs_blocks(window, with_sink):
    gen = torch.Generator().manual_seed(7)
    batch, heads, n, rows = 2, 3, 37, 8
    lengths = [37, 30]
    ids = [list(torch.randint(0, 6, (length,), generator=gen).tolist()) for length in lengths]  # many repeats
    logits = torch.randn(batch, heads, n, n, generator=gen) * 4
    sinks = torch.randn(heads, generator=gen) if with_sink else None
    masked = masked_logits(logits, lengths, window)
    lse = torch.logsumexp(masked, -1)
    if sinks is not None:
        lse = torch.logaddexp(lse, sinks[None, :, None])
    # masked keys: exp(-inf) = 0; a padding row past the window sees no key (NaN here): the reduce leaves it out
    weights = torch.nan_to_num(torch.exp(masked - lse[..., None]), nan=0.0)

    expected, got = RowStats(lengths, 1, ids), RowStats(lengths, 1, ids)
    got_lse = np.zeros((batch, heads, n), np.float32)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        expected.block(0, r0, weights[:, :, r0:r1, :r1].clone())
        block_lse = np.empty((batch, heads, r1 - r0), np.float32)
        got.from_logits(0, r0, logits[:, :, r0:r1, :r1].contiguous(), block_lse, False, window, sinks)
        got_lse[:, :, r0:r1] = block_lse
    for b, length in enumerate(lengths):
        np.testing.assert_allclose(got_lse[b, :, :length], lse[b, :, :length].numpy(), rtol=0, atol=2e-6)
        (want_stats, want_top), (stats, top) = expected.example(b), got.example(b)
        np.testing.assert_allclose(stats.astype(np.float64), want_stats.astype(np.float64), rtol=2**-10, atol=2e-6)
        np.testing.assert_array_equal(top, want_top)
        assert (stats[..., fmt.FIELD["duplicate"]] > 0).any() and (stats[..., fmt.FIELD["induction"]] > 0).any()
    np.testing.assert_allclose(got.column.numpy(), expected.column.numpy(), rtol=1e-5, atol=1e-6)

    # log-sum-exps given (a float32 run's, from flash): the same statistics from them
    given = RowStats(lengths, 1, ids)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        block_lse = lse[:, :, r0:r1].contiguous().numpy()
        given.from_logits(0, r0, logits[:, :, r0:r1, :r1].contiguous(), block_lse, True, window, sinks)
    for b in range(batch):
        np.testing.assert_allclose(given.example(b)[0].astype(np.float64), got.example(b)[0].astype(np.float64), rtol=2**-10, atol=2e-6)


def test_equal_weights_keep_the_earlier_keys_and_weights_under_float32s_normal_range_count_as_0():
    n = 12
    logits = torch.zeros(1, 1, n, n)
    logits[0, 0, n - 1, 3] = -200.0  # exp(-200 - lse) is far below SUBNORMAL: a weight of 0, out of the top keys
    stats = RowStats([n], 1)
    stats.from_logits(0, 0, logits, np.empty((1, 1, n), np.float32), False, None, None)
    fields, top = stats.example(0)
    last = n - 1
    assert top[last, 0, 0].tolist() == [0, 1, 2, 4, 5, 6, 7, 8]  # 11 equal weights of 1/11 (key 3: 0): the first 8 in order
    assert top[3, 0, 0].tolist() == [0, 1, 2, 3, -1, -1, -1, -1]  # row 3 sees 4 keys
    np.testing.assert_allclose(fields[last, 0, 0, fmt.TOP_VALUES].astype(np.float64), 1 / 11, rtol=2**-10)
    np.testing.assert_allclose(fields[last, 0, 0, fmt.FIELD["entropy"]], np.log(11), rtol=2**-10)
    assert abs(fields[last, 0, 0, fmt.FIELD["learned_sink"]]) < 1e-6  # 1 - the row's sum


def test_the_reduce_refuses_buffers_of_the_wrong_size():
    logits = torch.zeros(1, 2, 4, 4)
    with pytest.raises(ValueError, match="lse holds 24 bytes, not 32"):
        reduce_logits(logits, [4], 0, None, None, np.zeros((1, 2, 3), np.float32), False)
    with pytest.raises(ValueError, match="need keys up to the last row"):
        reduce_logits(logits, [4], 2, None, None, np.zeros((1, 2, 4), np.float32), False)


def test_a_stale_build_of_the_reduce_fails_in_one_line_naming_the_fix(monkeypatch):
    from attnstore.ingest import _rows
    from attnstore.ingest.errors import IngestError

    monkeypatch.setattr(_rows, "KERNEL_VERSION", 0)
    with pytest.raises(IngestError, match=r"ingest/_rows.c is a stale build \(version 0, want 1\): rebuild attnstore: pip install -e \."):
        reduce_logits(torch.zeros(1, 1, 2, 2), [2], 0, None, None, np.zeros((1, 1, 2), np.float32), False)


@pytest.mark.parametrize("window", [None, 5])
def test_the_sinks_cpu_pass_equals_its_device_path_run_on_the_cpu(window):
    """`QKSink._reduce_on_cpu` (the compiled reduce) against `QKSink._rebuild` (torch's, which other devices run) on the
    same stored float16 Q/K of a right-padded batch with GQA and learned sink logits: the log-sum-exps they store and
    the row statistics they reduce."""
    from attnstore.ingest.streaming import QKSink

    gen = torch.Generator().manual_seed(3)
    batch, heads, kv_heads, n, d, scale = 2, 4, 2, 29, 8, 8**-0.5
    lengths = [29, 21]
    ids = [list(torch.randint(0, 5, (length,), generator=gen).tolist()) for length in lengths]
    q = torch.randn(batch, n, 1, heads, d, generator=gen).to(torch.float16) * 2
    k = torch.randn(batch, n, 1, kv_heads, d, generator=gen).to(torch.float16) * 2
    sink = torch.randn(1, heads, 1, generator=gen)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    seen = (j <= i)[None] & (j[None] < torch.tensor(lengths)[:, None, None])
    if window:
        seen = seen & (i - j < window)[None]
    mask = seen[:, None]  # SDPA's boolean mask (batch, 1, row, key)
    results = []
    for on_cpu in (True, False):
        rows = RowStats(lengths, 1, ids)
        sink_of = QKSink(1, torch.float16, [window], lengths, rows=rows, q=q.clone(), k=k.clone(), lse=torch.zeros(batch, n, 1, heads))
        if on_cpu:
            sink_of._reduce_on_cpu(0, scale, heads // kv_heads, sink, own_lse=True)
        else:
            sink_of._rebuild(0, mask, scale, heads // kv_heads, "cpu", sink)
        results.append((sink_of.lse, rows))
    (lse, rows), (want_lse, want_rows) = results
    for b, length in enumerate(lengths):
        np.testing.assert_allclose(lse[b, :length].numpy(), want_lse[b, :length].numpy(), rtol=1e-6, atol=2e-6)
        (stats, top), (want_stats, want_top) = rows.example(b), want_rows.example(b)
        np.testing.assert_allclose(stats.astype(np.float64), want_stats.astype(np.float64), rtol=2**-10, atol=2e-6)
        assert (top == want_top).mean() > 0.99  # near-equal weights may swap ranks in float32
