"""ingest.runner.stores_during_forward: a batch is stored during the next forward pass only where that pass leaves cores free."""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from attnstore.ingest import runner  # noqa: E402


@pytest.mark.parametrize(("cores", "threads", "expected"), [(2, 2, 0), (4, 2, 1), (1, 1, 0), (16, 1, 1)])
def test_storing_overlaps_the_forward_pass_only_with_cores_to_spare(monkeypatch, cores, threads, expected):
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda _pid: set(range(cores)), raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    on_cpu = SimpleNamespace(model=torch.nn.Linear(2, 2))
    assert runner.stores_during_forward(on_cpu) == expected


def test_a_model_off_the_cpu_always_overlaps(monkeypatch):
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    on_meta = SimpleNamespace(model=torch.nn.Linear(2, 2, device="meta"))  # stands for a GPU: no CPU parameters
    assert runner.stores_during_forward(on_meta) == 1
