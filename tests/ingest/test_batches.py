from attnstore.ingest.align import Encoded
from attnstore.ingest.batches import plan_batches


def enc(i, length):
    return Encoded(example_id=i, position=i, input_ids=[0] * length, token_type_ids=None, tokens=[], truncated=False, full_length=length)


def test_batches_keep_every_example_sorted_within_windows():
    items = [enc(i, n) for i, n in enumerate([5, 3, 9, 1, 7, 2, 8, 4])]
    batches = list(plan_batches(items, batch_size=2, window_batches=2))
    assert [[e.length for e in b] for b in batches] == [[1, 3], [5, 9], [2, 4], [7, 8]]
    assert sorted(e.example_id for b in batches for e in b) == list(range(8))


def test_long_inputs_get_smaller_batches():
    items = [enc(i, 100) for i in range(10)] + [enc(10 + i, 10) for i in range(10)]
    batches = list(plan_batches(items, batch_size=8, window_batches=4, max_pairs=3 * 100**2))
    assert all(len(b) * max(e.length for e in b) ** 2 <= 3 * 100**2 for b in batches)
    assert [len(b) for b in batches] == [8, 3, 3, 3, 3]
    assert sum(len(b) for b in batches) == 20


def test_qk_batches_are_filled_to_a_token_budget():
    """The Q/K tier's batches grow with length, not its square: 8,192 tokens hold four of 2,048 or one of 8,192."""
    items = [enc(i, n) for i, n in enumerate([2048] * 5 + [8192, 100])]
    batches = list(plan_batches(items, batch_size=32, window_batches=4, max_tokens=8192))
    assert [[e.length for e in b] for b in batches] == [[100, 2048, 2048, 2048], [2048, 2048], [8192]]
