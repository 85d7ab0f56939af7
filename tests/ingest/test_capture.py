"""ingest/capture.py: the forward pass stops at the last map, and only where the maps are provably the same."""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from attnstore.ingest import capture  # noqa: E402


class Attend(torch.nn.Module):
    """Returns (mixed values, probabilities), as transformers' eager attention modules do."""

    def forward(self, x):
        probs = torch.softmax(x @ x.transpose(-1, -2), -1)
        return probs @ x, probs


class Tail(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * 2


class Toy(torch.nn.Module):
    """Two attention layers (`shared`: one module called twice, as ALBERT's), then a tail no map depends on."""

    def __init__(self, shared=False, rescale=False, inline=False):
        super().__init__()
        self.first = Attend()
        self.second = self.first if shared else Attend()
        self.tail = Tail()
        self.rescale, self.inline = rescale, inline

    def forward(self, x, output_attentions=True):
        x, a = self.first(x)
        if self.inline:  # the second map is computed here, by no module
            b = torch.softmax(x @ x.transpose(-1, -2), -1)
            x = b @ x
        else:
            x, b = self.second(x)
        if self.rescale:  # the model returns another tensor than its module did (equal values, another object)
            b = b * 1.0
        return SimpleNamespace(last=self.tail(x), attentions=(a, b))


@pytest.mark.parametrize("shared", [False, True])
def test_the_pass_stops_after_the_last_map_with_the_same_maps(shared):
    model = Toy(shared=shared)
    x = torch.tensor([[[1.0, 0.5], [0.25, -1.0], [0.0, 2.0]]])
    sources = capture.find_sources(model, lambda: model(x))
    assert sources is not None and sources.n_maps == 2 and sources.index == (1,) * len(sources.modules)
    assert len(sources.modules) == (1 if shared else 2)
    whole = model(x).attentions
    calls = model.tail.calls
    stopped = capture.attention_maps(model, {"x": x}, sources)
    assert model.tail.calls == calls  # nothing after the last map ran
    assert len(stopped) == 2 and all(torch.equal(a, b) for a, b in zip(stopped, whole))


@pytest.mark.parametrize("why", ["inline", "rescale"])
def test_a_map_no_module_returns_means_the_model_runs_whole(why):
    model = Toy(**{why: True})
    x = torch.tensor([[[1.0, 0.5], [0.25, -1.0]]])
    assert capture.find_sources(model, lambda: model(x)) is None


def test_passes_on_several_threads_each_get_their_own_maps():
    """Ingest runs two passes at once on a CPU: the hooks must not mix their maps up."""
    from concurrent.futures import ThreadPoolExecutor

    model = Toy()
    inputs = [torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(k)) for k in range(40)]
    sources = capture.find_sources(model, lambda: model(inputs[0]))
    assert sources is not None
    with ThreadPoolExecutor(4) as pool:
        stopped = list(pool.map(lambda x: capture.attention_maps(model, {"x": x}, sources), inputs))
    for x, maps in zip(inputs, stopped):
        whole = model(x).attentions
        assert len(maps) == 2 and all(torch.equal(a, b) for a, b in zip(maps, whole))


def test_a_whole_pass_after_a_stopped_one_runs_whole():
    model = Toy()
    x = torch.tensor([[[1.0, 0.5], [0.25, -1.0]]])
    sources = capture.find_sources(model, lambda: model(x))
    capture.attention_maps(model, {"x": x}, sources)
    calls = model.tail.calls
    assert len(model(x).attentions) == 2 and model.tail.calls == calls + 1  # the installed hooks are inert here
    assert len(model.first._forward_hooks) == 1  # installed once, however many passes
    capture.attention_maps(model, {"x": x}, sources)
    assert len(model.first._forward_hooks) == 1
