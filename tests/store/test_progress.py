"""Reading progress: every example `iter_attention` yields is reported to a listener, and only inside its scope."""

from __future__ import annotations

import numpy as np


def test_every_example_read_is_reported_inside_the_scope_only(store, make_run):
    from attnstore.queries import run_query
    from attnstore.store.progress import advance, reporting

    maps = [np.full((1, 2, n, n), 1.0 / n, dtype=np.float32) for n in (3, 4, 2)]
    make_run(store, maps, [["[CLS]", "a", "[SEP]"], ["[CLS]", "a", "b", "[SEP]"], ["[CLS]", "[SEP]"]], name="p")
    seen: list[int] = []
    with reporting(seen.append):
        assert len(list(store.iter_attention("p"))) == 3
    assert sum(seen) == 3
    list(store.iter_attention("p"))
    advance()
    assert sum(seen) == 3  # nobody listens outside the scope
    with reporting(seen.append):
        run_query(store, "entropy", run="p")
    assert sum(seen) >= 6  # a query reads through the same path
