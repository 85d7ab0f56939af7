"""Every picture attnstore draws leaves matplotlib's backend alone, numbers layers and heads from 0 (as the data),
and lays out without overlaps: no legend over the data, no title under the suptitle, panels apart, a colour bar.

The report figures are fed realistic per-head frames (6 layers x 12 heads, the default model's shape) through a
stand-in store and `run_query`, so these tests need neither the model nor stored maps.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.slow  # renders and checks figures (matplotlib)

matplotlib = pytest.importorskip("matplotlib")

N_LAYERS, N_HEADS = 6, 12
PACKAGE = Path(__file__).parents[2]
# matplotlib warns, and draws anyway, where constrained layout cannot fit the decorations (panels overlap then)
LAYOUT_FAILED_IS_AN_ERROR = pytest.mark.filterwarnings("error:constrained_layout not applied")
SWITCHES_OR_PYPLOT = re.compile(
    r"^\s*(import matplotlib\.pyplot|from matplotlib import pyplot|from matplotlib\.pyplot import)|matplotlib\.use\(", re.M
)


@pytest.fixture
def svg_backend():
    """A notebook's situation: a backend other than Agg is in use (here the non-interactive 'svg')."""
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    yield "svg"
    matplotlib.use(before)


def _renderer(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # draws this figure only; the global backend is untouched
    canvas.draw()
    return canvas.get_renderer()


def _overlap(a, b, tolerance: float = 1.0) -> bool:
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return width > tolerance and height > tolerance


def _is_colorbar(ax) -> bool:
    return ax.get_label() == "<colorbar>"


def panels(fig) -> list:
    return [ax for ax in fig.axes if ax.get_visible() and not _is_colorbar(ax)]


def _parts(ax, renderer) -> list:
    """The boxes an axes draws in: its data area, titles, each axis with its tick labels and label, its legend."""
    boxes = [ax.get_window_extent(renderer), ax.xaxis.get_tightbbox(renderer), ax.yaxis.get_tightbbox(renderer)]
    boxes += [t.get_window_extent(renderer) for t in (ax.title, ax._left_title, ax._right_title) if t.get_text()]
    if ax.get_legend() is not None:
        boxes.append(ax.get_legend().get_window_extent(renderer))
    return [b for b in boxes if b is not None and b.width > 0 and b.height > 0]


def assert_laid_out(fig) -> None:
    """No two axes (panels, colour bars; with their titles, tick and axis labels, legends) overlap, none overlaps
    the suptitle, and every legend sits outside the data area of every panel."""
    renderer = _renderer(fig)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    parts = [_parts(ax, renderer) for ax in axes]
    for i in range(len(axes)):
        for j in range(i + 1, len(axes)):
            clash = any(_overlap(a, b) for a in parts[i] for b in parts[j])
            assert not clash, f"axes {axes[i].get_title()!r} and {axes[j].get_title()!r} overlap"
    if fig.get_suptitle():
        top = fig._suptitle.get_window_extent(renderer)
        for ax, boxes in zip(axes, parts):
            assert not any(_overlap(top, b) for b in boxes), f"the suptitle overlaps axes {ax.get_title()!r}"
    legends = [ax.get_legend() for ax in axes if ax.get_legend() is not None] + list(fig.legends)
    for legend in legends:
        where = legend.get_window_extent(renderer)
        for ax in panels(fig):
            assert not _overlap(where, ax.get_window_extent(renderer)), f"a legend lies over the data of {ax.get_title()!r}"


def assert_zero_based_layer_axis(ax, n_layers: int = N_LAYERS) -> None:
    assert "0-based" in ax.get_xlabel() and "layer" in ax.get_xlabel()
    assert [round(t) for t in ax.get_xticks()] == list(range(n_layers))
    lo, hi = ax.get_xlim()
    assert lo < 0 < n_layers - 1 < hi


# --- A: the backend --------------------------------------------------------------------------------------------


@pytest.fixture
def hand_store(store, make_run):
    maps = np.zeros((2, 3, 4, 4), dtype=np.float32)
    maps[..., 0] = 1.0
    maps[1, 2] = np.eye(4)
    make_run(store, [maps], [["[CLS]", "a", "b", "[SEP]"]], name="fig")
    return store


@pytest.mark.one_backend
def test_store_plot_and_view_leave_the_backend_alone(hand_store, svg_backend, tmp_path):
    from attnstore.api.view import save_view

    figures = [hand_store.plot("fig", 0, layer=1, head=2), hand_store.plot("fig", 0, layer=0), hand_store.plot("fig", 0)]
    save_view(hand_store, "fig", 0, str(tmp_path / "v.png"), layer=1)
    assert matplotlib.get_backend() == svg_backend
    import matplotlib.pyplot as plt

    assert plt.get_fignums() == []  # pyplot holds none of them: a notebook's later figures are its own
    for fig in figures:
        assert fig._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"  # shows inline in Jupyter even where pyplot was never imported


def test_no_library_module_switches_the_backend_or_uses_pyplot():
    """Library code builds Figure objects; pyplot and matplotlib.use are for the user's own session."""
    offenders = []
    for folder in ("store", "queries", "ingest", "api"):
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if SWITCHES_OR_PYPLOT.search(text):
                offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []


# --- C: layout and 0-based numbering, per figure ------------------------------------------------------------------


class FakeStore:
    """What the report figures read from a store besides query results: run descriptions."""

    def run_info(self, run):
        model = "all-MiniLM-L6-v2" if "tuned" not in str(run) else f"all-MiniLM-L6-v2-{str(run).split('-')[0]}-pretrained-seed0"
        return SimpleNamespace(
            name=str(run), model=model, dataset="ud/en_ewt", split="dev", n_stored=2001, n_layers=N_LAYERS, n_heads=N_HEADS
        )


def _heads(rng, **columns) -> pd.DataFrame:
    layer, head = np.divmod(np.arange(N_LAYERS * N_HEADS), N_HEADS)
    frame = pd.DataFrame({"layer": layer, "head": head})
    for name, (lo, hi) in columns.items():
        frame[name] = rng.uniform(lo, hi, len(frame))
    return frame


def fake_query(store, name, run=None, **kwargs) -> pd.DataFrame:
    rng = np.random.default_rng(len(str(run)) + len(name))
    if name == "special_tokens":
        frame = _heads(rng, to_cls=(0.0, 0.8), to_sep=(0, 0.1), to_punct=(0, 0.2), sep_from_sep=(0, 0.42), sep_from_other=(0, 0.11))
        frame.loc[frame["layer"] == N_LAYERS - 2, "to_cls"] = 0.78  # data in the top right corner, where legends used to go
        frame["to_other"] = 1 - frame[["to_cls", "to_sep", "to_punct"]].sum(axis=1)
        return frame
    if name == "entropy":
        frame = _heads(rng, entropy=(0.0, 3.05), entropy_from_cls=(0.0, 2.3))
        return frame.assign(uniform_entropy=3.06, uniform_entropy_from_cls=3.0)
    if name == "head_clusters":
        return _heads(rng, x=(-1, 1), y=(-1, 1))
    if name == "pattern_proportions":
        labels = ["vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous"]
        share = rng.dirichlet(np.ones(len(labels)))
        return pd.DataFrame({"label": labels, "n_maps": (share * 1000).astype(int), "fraction": share, "n_examples": 408})
    if name == "frame_heads":
        frame = _heads(rng, value=(0, 0.21)).assign(n_sentences=2757)
        return frame.assign(top=frame["value"] >= frame["value"].quantile(0.99))
    if name == "run_similarity":
        return _heads(rng, similarity=(0.5, 1.0)).assign(n_examples=408)
    if name == "feature_attention":
        features = ("sep", "cls", "noun", "verb", "pronoun", "subject", "object", "negation")
        return pd.concat([_heads(rng, value=(0, 0.5)).assign(feature=f, n_examples=408) for f in features], ignore_index=True)
    if name == "cls_feature_attention":
        features = ("noun", "verb", "pronoun", "subject", "object", "negation", "cls", "sep")
        frames = []
        for f in features:
            part = _heads(rng, value=(0, 0.5))
            part = part[part["layer"] == N_LAYERS - 1]
            frames.append(part.assign(feature=f, mean_over_heads=part["value"].mean(), n_examples=408))
        return pd.concat(frames, ignore_index=True)
    raise AssertionError(name)


@pytest.fixture
def captured(monkeypatch):
    """The figures the report functions would save (PNG and SVG: test_report.py checks those files), kept here
    for inspection instead."""
    from attnstore.api import ablation_report, kovaleva_report, report

    figures: dict[str, object] = {}

    def save(fig, out, stem):
        figures[stem] = fig
        return [f"{stem}.png", f"{stem}.svg"]

    for module in (report, kovaleva_report, ablation_report):
        monkeypatch.setattr(module, "_save", save)
    monkeypatch.setattr(report, "run_query", fake_query)
    monkeypatch.setattr(kovaleva_report, "run_query", fake_query)
    return figures


@LAYOUT_FAILED_IS_AN_ERROR
def test_clark_figures(captured, svg_backend, tmp_path):
    from attnstore.api import report

    store = FakeStore()
    report.figure_special_tokens(store, "ud-dev", tmp_path)
    report.figure_entropy(store, "ud-dev", tmp_path)
    report.figure_mds(store, "ud-dev", tmp_path, None)
    grads = pd.concat(
        [fake_query(store, "entropy").assign(metric=m, value=0.1) for m in ("gradient.to_sep", "gradient.to_cls", "gradient.to_other")]
    )
    report.figure_gradients(store, "ud-dev", grads, tmp_path)
    assert matplotlib.get_backend() == svg_backend
    assert set(captured) == {"fig2_special_tokens", "fig4_entropy", "fig6_mds", "fig3_gradients"}
    for stem, fig in captured.items():
        assert_laid_out(fig)
        if stem != "fig6_mds":
            for ax in panels(fig):
                assert_zero_based_layer_axis(ax)
    left, right = panels(captured["fig2_special_tokens"])
    assert left.get_legend() is not None and right.get_legend() is not None  # kept, but beside the data
    points = left.collections[0].get_offsets()  # the jittered points of layer L sit around x = L, not L + 1
    assert abs(points[:, 0].min()) < 0.5 and abs(points[:, 0].max() - (N_LAYERS - 1)) < 0.5
    colorbar = next(ax for ax in captured["fig6_mds"].axes if _is_colorbar(ax))
    assert colorbar.get_ylabel() == "layer (0-based)" and [round(t) for t in colorbar.get_yticks()] == list(range(N_LAYERS))


@LAYOUT_FAILED_IS_AN_ERROR
@pytest.mark.parametrize("tasks", [["MRPC"], ["RTE", "STS-B", "SST-2"]])  # the two shapes in docs/results
def test_kovaleva_figures(captured, svg_backend, tmp_path, tasks):
    from attnstore.api import kovaleva_report

    store = FakeStore()
    runs = {task: f"{task}-dev" for task in tasks}
    tuned = {task: f"{task}-tuned" for task in tasks}
    kovaleva_report.figure_patterns(store, runs, tmp_path, 1000)
    kovaleva_report.figure_frame_heads(store, "framenet", tmp_path)
    kovaleva_report.figure_similarity(store, {t: (runs[t], tuned[t]) for t in tasks}, tmp_path, 1000)
    kovaleva_report.figure_features(store, runs, tmp_path, "fig6_features", "Fig. 6: normalised attention to feature tokens")
    kovaleva_report.figure_features(store, tuned, tmp_path, "fig6_features_finetuned", "Fig. 6 after fine-tuning")
    kovaleva_report.figure_cls(store, runs, tmp_path)
    assert matplotlib.get_backend() == svg_backend
    for stem, fig in captured.items():
        assert_laid_out(fig)
        if stem in ("fig3_frame_heads", "fig5_similarity", "fig6_features", "fig6_features_finetuned"):
            for ax in panels(fig):
                assert ax.get_xlabel() == "head (0-based)" and ax.get_ylabel() == "layer (0-based)"
                assert [t.get_text() for t in ax.get_yticklabels()] == [str(i) for i in range(N_LAYERS)]
            assert any(_is_colorbar(ax) for ax in fig.axes), stem
    similarity = captured["fig5_similarity"]
    assert len(panels(similarity)) == len(tasks) and "Fig. 5" in similarity.get_suptitle()
    features = captured["fig6_features_finetuned"]
    assert len(panels(features)) == 8 * len(tasks)
    assert sum(_is_colorbar(ax) for ax in features.axes) == 8  # one scale per feature row


def _ablation_store(store):
    """Single-head and whole-layer scores of one fine-tuned model, as `attnstore ablate` stores them."""
    import uuid

    model = store.writer.register_finetuned_model(
        name="m-MRPC",
        source="models/m",
        weights_sha256=uuid.uuid4().hex,
        architecture="X",
        n_layers=N_LAYERS,
        n_heads=N_HEADS,
        max_length=128,
        tokenizer="t",
        special_tokens={},
        parent_id=None,
        init="finetuned",
        task="MRPC",
        training=dict(hparams=dict(lr=2e-5, batch_size=32, epochs=3, seed=0), complete=True, checkpoint="m"),
    )
    rng = np.random.default_rng(0)
    base = dict(model_id=model, task="MRPC", split="dev", mode="uniform", metric="f1", baseline_score=82.9, n_examples=408)
    rows = [dict(base, config="none", disabled_heads=[], score=82.9, baseline_score=None)]
    for layer in range(N_LAYERS):
        heads = [[layer, h] for h in range(N_HEADS)]
        rows.append(dict(base, config=f"layer:{layer}", disabled_heads=heads, score=83.4 if layer else 63.0))
        for head in range(N_HEADS):
            rows.append(dict(base, config=f"heads:{layer}:{head}", disabled_heads=[[layer, head]], score=82.9 + rng.normal(0, 0.4)))
    assert store.writer.add_ablation_results(rows)


def test_the_noise_caveat_sets_gains_against_standard_errors():
    from attnstore.api.ablation_report import _noise_caveat

    verdict = pd.DataFrame({"mean_delta": [1.1, -0.4, 0.2]})
    (line, blank) = _noise_caveat(verdict, [3.0, 1.2])
    assert line.startswith(
        "**Noise.** The largest mean gain from disabling one head is +1.1 points, against binomial standard errors of 1.2-3.0"
    )
    assert "within the noise" in line and blank == ""
    assert "above some of the noise" in _noise_caveat(verdict, [0.5])[0] and "errors of 0.5 points" in _noise_caveat(verdict, [0.5])[0]
    assert _noise_caveat(verdict, []) == [] and _noise_caveat(verdict.iloc[:0], [1.0]) == []


@LAYOUT_FAILED_IS_AN_ERROR
@pytest.mark.one_backend
def test_ablation_figures(store, captured, svg_backend, tmp_path):
    from attnstore.api.ablation_report import ablation_report

    _ablation_store(store)
    ablation_report(store, str(tmp_path))
    text = (tmp_path / "ablation_uniform.md").read_text()
    assert "**Noise.**" not in text  # MRPC's headline metric is F1: no binomial standard error to compare with
    assert matplotlib.get_backend() == svg_backend
    assert set(captured) == {"fig8_MRPC_m-MRPC", "fig9_MRPC_m-MRPC"}
    for fig in captured.values():
        assert_laid_out(fig)
    (heads,) = panels(captured["fig8_MRPC_m-MRPC"])
    assert heads.get_xlabel() == "head (0-based)" and heads.get_ylabel() == "layer (0-based)"
    (layers,) = panels(captured["fig9_MRPC_m-MRPC"])
    assert layers.get_xlabel() == "disabled layer (0-based)" and [round(t) for t in layers.get_xticks()] == list(range(N_LAYERS))


@LAYOUT_FAILED_IS_AN_ERROR
@pytest.mark.one_backend
def test_view_panels_apart_with_one_colour_bar(store, make_run, svg_backend):
    from attnstore.store.plot import plot_attention

    rng = np.random.default_rng(0)
    tokens = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]
    maps = rng.dirichlet(np.ones(len(tokens)), size=(2, 12, len(tokens))).astype(np.float32)
    make_run(store, [maps], [tokens], name="grid")
    for layer, head in ((1, 4), (1, None), (None, None)):
        fig = plot_attention(store, "grid", 0, layer=layer, head=head)
        assert_laid_out(fig)
        bars = [ax for ax in fig.axes if _is_colorbar(ax)]
        assert len(bars) == 1 and bars[0].get_ylabel() == "attention", (layer, head)
        assert bars[0].get_ylim() == (0.0, 1.0)  # one scale for every panel
        expected = 1 if head is not None else 12 if layer is not None else 24
        assert len(panels(fig)) == expected
    assert matplotlib.get_backend() == svg_backend


@LAYOUT_FAILED_IS_AN_ERROR
def test_head_match_layers_labels_clear_the_title(svg_backend):
    """Long model names (a fine-tuned model's) go into the wrapped title, not the axis labels: the y label stays within
    the axes' height and clear of the title."""
    from attnstore.api.head_match_report import draw_layers, layer_depths

    a = SimpleNamespace(model="all-MiniLM-L6-v2", n_layers=N_LAYERS, n_heads=N_HEADS)
    b = SimpleNamespace(model="all-MiniLM-L6-v2-MRPC-pretrained-seed0-with-a-long-name", n_layers=N_LAYERS, n_heads=N_HEADS)
    layer, head = np.divmod(np.arange(N_LAYERS * N_HEADS), N_HEADS)
    match = pd.DataFrame({"layer": layer, "head": head, "match_layer": pd.array(layer, dtype="Int64")})
    fig = draw_layers(layer_depths(match, a, b), match, a, b)
    assert_laid_out(fig)
    renderer = _renderer(fig)
    (ax,) = panels(fig)
    label, title = ax.yaxis.label.get_window_extent(renderer), ax.title.get_window_extent(renderer)
    assert not _overlap(label, title) and label.height <= ax.get_window_extent(renderer).height
    assert b.model in ax.get_title().replace("\n", " ") and b.model not in ax.get_ylabel()


@LAYOUT_FAILED_IS_AN_ERROR
def test_the_pruning_curve_has_its_majority_class_line(svg_backend):
    """Each metric's majority-class score is a dashed line of its colour, labelled; the fixture's 8 MRPC dev pairs are
    4 and 4, so the majority class is the first label (0): accuracy 50, F1 0 (no positive predicted)."""
    from attnstore.api.ablation_report import draw_pruning, majority_scores

    fixtures = str(PACKAGE / "tests" / "fixtures" / "data")
    assert majority_scores("MRPC", data_dir=fixtures) == {"f1": 0.0, "accuracy": 50.0}
    assert majority_scores("STS-B", data_dir=fixtures) is None and majority_scores("MRPC", data_dir="/nowhere") is None
    steps = pd.DataFrame({"n_pruned": [0, 8, 16] * 2, "metric": ["accuracy"] * 3 + ["f1"] * 3, "score": [83, 82, 75, 85, 84, 80.0]})
    fig = draw_pruning(steps, "m", "MRPC", "zero", majority={"accuracy": 68.4, "f1": 81.2})
    assert_laid_out(fig)
    (ax,) = panels(fig)
    dashed = {line.get_label(): line for line in ax.get_lines() if line.get_linestyle() == "--"}
    assert set(dashed) == {"accuracy: majority class (68.4)", "f1: majority class (81.2)"}
    solid = {line.get_label(): line.get_color() for line in ax.get_lines() if line.get_linestyle() == "-"}
    assert (
        dashed["f1: majority class (81.2)"].get_color() == solid["f1"]
        and list(dashed["f1: majority class (81.2)"].get_ydata()) == [81.2] * 2
    )
    without = draw_pruning(steps.assign(n_examples=8), "m", "STS-B", "zero")
    assert "no majority-class line: a regression task" in panels(without)[0].get_title()


@LAYOUT_FAILED_IS_AN_ERROR
def test_head_roles_marks_positional_heads_without_a_legend(svg_backend):
    """The positional heads are framed and the title says so: no legend between the map and its colour bar."""
    from attnstore.api.primer_report import draw_confidence

    roles = _heads(np.random.default_rng(0), confidence=(0, 1)).assign(positional=False)
    roles.loc[2, "positional"] = True
    fig = draw_confidence(roles, N_LAYERS, N_HEADS, "a caption")
    assert_laid_out(fig)
    (ax,) = panels(fig)
    assert ax.get_legend() is None and not fig.legends and "framed red: 1 positional head" in ax.get_title()
    (frame,) = ax.patches
    assert (frame.get_x(), frame.get_y()) == (1.5, -0.5)  # layer 0, head 2


@LAYOUT_FAILED_IS_AN_ERROR
def test_kovaleva_fig5_tells_heads_apart_above_099_and_fig6_of_one_task_is_not_a_strip(svg_backend):
    """Fig. 5's colours follow 1 - similarity on a log scale, so heads at 0.995 and 0.9995 differ (a linear 0-1 scale
    gave them one colour); Fig. 6 of one task is a grid of its eight features, about square, one colour bar each."""
    from matplotlib.colors import LogNorm

    from attnstore.api.kovaleva_report import draw_features, draw_similarity

    frame = _heads(np.random.default_rng(0), similarity=(0.999, 0.9999))
    frame.loc[0, "similarity"], frame.loc[1, "similarity"] = 0.995, 0.9995
    fig = draw_similarity({"RTE": frame}, N_LAYERS, N_HEADS, {"RTE": "tuned"})
    assert_laid_out(fig)
    (ax,) = panels(fig)
    image = ax.images[0]
    assert isinstance(image.norm, LogNorm) and image.norm.vmin < 5e-4
    colours = image.cmap(image.norm(image.get_array()))
    assert not np.allclose(colours[0, 0], colours[0, 1], atol=0.05)  # 0.995 and 0.9995 tell apart
    bar = next(a for a in fig.axes if _is_colorbar(a))
    assert "0.999" in [t.get_text() for t in bar.get_yticklabels()]  # the scale reads in similarity
    features = {f: _heads(np.random.default_rng(1), value=(0, 0.4)) for f in ("sep", "cls", "noun", "verb", "pronoun", "subject")}
    table = pd.concat([part.assign(feature=f) for f, part in features.items()], ignore_index=True)
    fig = draw_features({"MRPC": table}, N_LAYERS, N_HEADS, {"MRPC": "m"}, "Fig. 6")
    assert_laid_out(fig)
    width, height = fig.get_size_inches()
    assert len(panels(fig)) == 6 and 0.6 < height / width < 1.6 and sum(_is_colorbar(a) for a in fig.axes) == 6


@LAYOUT_FAILED_IS_AN_ERROR
def test_clark_fig6_lists_present_behaviours_and_keeps_an_outlier_at_the_edge(svg_backend):
    from attnstore.api.report import draw_mds

    rng = np.random.default_rng(0)
    points = _heads(rng, x=(-1, 1), y=(-1, 1))
    points.loc[2, ["x", "y"]] = [3.0, -40.0]  # head 0-2, far below the rest
    behaviour = _heads(rng, to_sep=(0, 0.1), to_punct=(0, 0.2)).assign(to_cls=0.1)
    behaviour.loc[behaviour["layer"] == 3, "to_cls"] = 0.8  # [CLS]-like heads and others; none [SEP]-like or on punctuation
    fig = draw_mds(points, behaviour, N_LAYERS, "a caption", 500)
    assert_laid_out(fig)
    left, right = panels(fig)
    labels = [t.get_text() for t in right.get_legend().get_texts()]
    assert labels == ["> 50 % to [CLS]-like", "other", "off the scale, drawn at the edge"]
    for ax in (left, right):
        low, high = ax.get_ylim()
        assert low > -10 and high - low < 8  # the outlier (at -40) does not set the scale
        assert [t.get_text() for t in ax.texts] == ["L0-H2\n(off scale)"]
