"""`attnstore view`: heatmaps of one example (one head, a layer, every head) and bertviz input, on a hand-built run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.slow  # figures: matplotlib draws every picture: not in make test-fast

pytest.importorskip("matplotlib")


@pytest.fixture
def hand_store(store, make_run):
    maps = np.zeros((2, 3, 4, 4), dtype=np.float32)
    maps[..., 0] = 1.0  # every head attends to [CLS]
    maps[1, 2] = np.eye(4)  # except L1-H2, which attends to itself
    make_run(store, [maps], [["[CLS]", "a", "b", "[SEP]"]], name="view")
    return store, maps


@pytest.mark.one_backend
def test_pictures_of_one_head_a_layer_and_every_head(hand_store, tmp_path):
    from PIL import Image

    from attnstore.api.view import plot_attention, save_view

    store, _ = hand_store
    for layer, head, name in ((1, 2, "one.png"), (1, None, "layer.png"), (None, None, "all.svg")):
        path = save_view(store, "view", 0, str(tmp_path / name), layer=layer, head=head)
        assert path.stat().st_size > 1000
    assert Image.open(tmp_path / "one.png").size[0] > 100
    fig = plot_attention(store, "view", 0, layer=1, head=2)
    ax = fig.axes[0]
    np.testing.assert_array_equal(ax.images[0].get_array(), np.eye(4))  # the stored map, unchanged
    labels = ax.get_xticklabels()
    assert [t.get_text() for t in labels] == ["[CLS]", "a", "b", "[SEP]"]
    assert labels[0].get_color() == "tab:red" and labels[1].get_color() != "tab:red"  # special tokens marked
    assert ax.get_xlabel() == "key (attended to)" and "layer 1, head 2 (0-based)" in ax.get_title()
    grid = plot_attention(store, "view", 0)
    panels = [ax for ax in grid.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 6 and len(grid.axes) == 7  # 2 layers x 3 heads, and one colour bar for all of them


@pytest.mark.one_backend
def test_store_plot_in_a_notebook(hand_store):
    store, maps = hand_store
    fig = store.plot("view", 0, layer=0)  # one layer's heads
    assert [ax.get_title() for ax in fig.axes if ax.get_label() != "<colorbar>"] == ["L0-H0", "L0-H1", "L0-H2"]
    np.testing.assert_array_equal(fig.axes[1].images[0].get_array(), maps[0, 1])
    handle_fig = store.run("view").plot(0, layer=1, head=2)
    np.testing.assert_array_equal(handle_fig.axes[0].images[0].get_array(), np.eye(4))
    with pytest.raises(Exception, match="--head needs --layer"):
        store.plot("view", 0, head=1)


@pytest.mark.one_backend
def test_bertviz_input(hand_store, tmp_path):
    from attnstore.api.view import bertviz_input

    store, maps = hand_store
    data = bertviz_input(store, "view", 0)
    assert data["tokens"] == ["[CLS]", "a", "b", "[SEP]"] and data["sentence_b_start"] is None
    assert len(data["attention"]) == 2 and np.array(data["attention"][1]).shape == (1, 3, 4, 4)
    np.testing.assert_array_equal(np.array(data["attention"][1])[0], maps[1])


@pytest.mark.one_backend
def test_view_command_and_its_errors(hand_store, tmp_path):
    from attnstore.api.cli import main

    store, _ = hand_store
    where = ["--db", store.locations.db_url, "--root", store.locations.array_root]
    runner = CliRunner()
    ok = runner.invoke(main, ["view", "--run", "view", "--example", "0", "--layer", "0", "--out", str(tmp_path / "v.png"), *where])
    assert ok.exit_code == 0, ok.output and (tmp_path / "v.png").exists()
    ok = runner.invoke(main, ["view", "--run", "view", "--example", "0", "--bertviz", "--out", str(tmp_path / "b.json"), *where])
    assert ok.exit_code == 0 and json.loads((tmp_path / "b.json").read_text())["tokens"][0] == "[CLS]"
    for args, message in (
        (["--out", str(tmp_path / "v.txt")], "give a file ending in .png or .svg"),
        (["--head", "1", "--out", str(tmp_path / "h.png")], "--head needs --layer"),
        (["--layer", "7", "--out", str(tmp_path / "l.png")], "layer"),
        (["--example", "5", "--out", str(tmp_path / "e.png")], "example"),
    ):
        base = ["view", "--run", "view"] + ([] if "--example" in args else ["--example", "0"])
        bad = runner.invoke(main, [*base, *args, *where])
        assert bad.exit_code == 1 and message in bad.output and "Traceback" not in bad.output, bad.output
        assert len(bad.output.strip().splitlines()) == 1


@pytest.mark.one_backend
def test_the_rollout_view_draws_every_layer_or_one(hand_store, tmp_path):
    from PIL import Image

    from attnstore.api.cli import main
    from attnstore.api.view import plot_rollout
    from attnstore.queries.rollout import rollout

    store, maps = hand_store
    where = ["--db", store.locations.db_url, "--root", store.locations.array_root]
    for extra, name in (([], "rollout.png"), (["--layer", "1"], "rollout1.svg")):
        result = CliRunner().invoke(
            main, ["view", "--run", "view", "--example", "0", "--rollout", "--out", str(tmp_path / name), *extra, *where]
        )
        assert result.exit_code == 0, result.output
        assert (tmp_path / name).stat().st_size > 1000
    assert Image.open(tmp_path / "rollout.png").size[0] > 300
    fig = plot_rollout(store, "view", 0)
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.images]
    assert len(panels) == 2 and [ax.get_title() for ax in panels] == ["rollout to layer 0 (0-based)", "rollout to layer 1 (0-based)"]
    np.testing.assert_allclose(panels[1].images[0].get_array(), rollout(maps)[1])  # what is drawn is the rollout
    refused = CliRunner().invoke(
        main,
        ["view", "--run", "view", "--example", "0", "--rollout", "--head", "1", "--layer", "0", "--out", str(tmp_path / "x.png"), *where],
    )
    assert refused.exit_code != 0 and "--rollout averages every head of a layer" in refused.output


@pytest.mark.one_backend
def test_the_rollout_of_six_layers_is_a_grid_with_readable_tokens(store, make_run):
    """Six layers are two rows of three panels (not one row six panels wide), each labelled with its tokens while an
    example has at most 64; the figure stays within 16 inches across."""
    from attnstore.api.view import plot_rollout
    from attnstore.store.plot import MAX_FIGURE_INCHES

    rng = np.random.default_rng(0)
    tokens = ["[CLS]", *(f"w{i}" for i in range(50)), "[SEP]"]  # an MRPC pair's length
    make_run(store, [rng.dirichlet(np.ones(52), size=(6, 2, 52)).astype(np.float32)], [tokens], name="six")
    fig = plot_rollout(store, "six", 0)
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.images]
    assert len(panels) == 6
    shape = {(ax.get_subplotspec().rowspan.start, ax.get_subplotspec().colspan.start) for ax in panels}
    assert shape == {(r, c) for r in range(2) for c in range(3)}
    width, height = fig.get_size_inches()
    assert width <= MAX_FIGURE_INCHES + 1.2 and width / height < 2
    labels = [t.get_text() for t in panels[0].get_xticklabels()]
    assert labels[:2] == ["[CLS]", "w0"] and len(labels) == 52
    assert panels[0].get_xticklabels()[1].get_fontsize() >= 4


@pytest.mark.one_backend
def test_view_text_draws_a_typed_sentence_as_ingest_would_store_it(store, tmp_path, tiny_bert):
    """`attnstore view --text "..." --model M --layer L --head H --out FILE.png` (issue 29): the typed sentence's map,
    equal to `attention_for_text`'s; `--run RUN --text` uses the run's model; the errors are one line each."""
    pytest.importorskip("torch")
    from PIL import Image

    from attnstore.api.cli import main
    from attnstore.api.view import plot_scratch
    from attnstore.ingest.runner import ingest
    from attnstore.ingest.scratch import attention_for_text

    runner = CliRunner()
    out = tmp_path / "typed.png"
    result = runner.invoke(
        main,
        [
            "view",
            "--text",
            "the cat sat.",
            "--text-b",
            "a dog ran.",
            "--model",
            tiny_bert,
            "--layer",
            "1",
            "--head",
            "2",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {out} (") and "tokens" in result.output
    assert Image.open(out).size[0] > 100
    typed = attention_for_text(tiny_bert, "the cat sat.", "a dog ran.")
    fig = plot_scratch(typed, layer=1, head=2)
    np.testing.assert_array_equal(fig.axes[0].images[0].get_array(), typed.attention[1, 2])
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == typed.token_texts
    grid = plot_scratch(typed)
    assert len([ax for ax in grid.axes if ax.get_label() != "<colorbar>"]) == 2 * 4
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat.\n", encoding="utf-8")
    ingest(store, corpus=str(corpus), fmt="text", model=tiny_bert, annotator="whitespace", name="typed", progress=False)
    where = ["--db", store.locations.db_url, "--root", store.locations.array_root]
    result = runner.invoke(
        main, ["view", "--run", "typed", "--text", "the cat sat.", "--layer", "0", "--out", str(tmp_path / "r.svg"), *where]
    )
    assert result.exit_code == 0, result.output
    for args, message in (
        (["--text", "x", "--example", "0", "--run", "typed"], "leave out --example"),
        (["--text", "x", "--run", "typed", "--model", tiny_bert], "give one of them"),
        (["--text", "x", "--model", tiny_bert, "--layer", "9"], "--layer 9 is out of range: the model has 2 layers"),
        (["--text", "   ", "--model", tiny_bert], "the text is empty"),
        (["--text-b", "x", "--run", "typed", "--example", "0"], "--text-b and --model go with --text"),
        (["--run", "typed"], "give --run and --example"),
    ):
        bad = runner.invoke(main, ["view", *args, "--out", str(tmp_path / "bad.png"), *where])
        assert bad.exit_code == 1 and message in bad.output and "Traceback" not in bad.output, bad.output
        assert len(bad.output.strip().splitlines()) == 1
