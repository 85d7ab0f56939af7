"""The saved results a store reads back beside its runs: per-head values (`head_metrics`), cross-model head matches,
probe and ablation results, attention-pattern labels (Kovaleva et al. K1) with their examples' corpus rows, and the
registered models. Each is one query over SQL. `SavedResultReads` is a base of `StoreReader` (store/reader.py), so
they are read as `store.head_metrics(...)`; their writes are `Store`'s (store/store.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import sqlalchemy as sa
import sqlalchemy.orm

from .schema import AblationResult, Dataset, Example, HeadMatch, HeadMetric, Model, ProbeResult, Run, Sequence

if TYPE_CHECKING:
    from .reader import RunRef
    from .records import RunInfo


class SavedResultReads:
    """The reads of saved results; `StoreReader` gives them its SQL (`session`, `run_info`, `_frame`, `_visible`)."""

    if TYPE_CHECKING:

        def session(self): ...

        def run_info(self, run: RunRef) -> RunInfo: ...

        def _frame(self, query) -> pd.DataFrame: ...

        def _visible(self, info: RunInfo): ...

    # ------------------------------------------------------------------ saved results and models

    def head_metrics(self, run: RunRef | None = None, metric: str | None = None) -> pd.DataFrame:
        """Saved per-head values: run, metric, params, layer, head, value (optionally one run / metric)."""
        q = sa.select(
            Run.name.label("run"), HeadMetric.metric, HeadMetric.params, HeadMetric.layer, HeadMetric.head, HeadMetric.value
        ).join(Run, Run.id == HeadMetric.run_id)
        if run is not None:
            q = q.where(HeadMetric.run_id == self.run_info(run).id)
        if metric is not None:
            q = q.where(HeadMetric.metric == metric)
        return self._frame(q.order_by(HeadMetric.metric, HeadMetric.layer, HeadMetric.head))

    def head_matches(self, run: RunRef | None = None) -> pd.DataFrame:
        """Saved cross-model head matches (`attnstore query head_match --save`): run, other, params, layer, head,
        match_layer, match_head, distance, ... (optionally those of one run A)."""
        other = sa.orm.aliased(Run)
        columns = [c for c in HeadMatch.__table__.columns if c.name not in ("id", "run_id", "other_run_id", "created_at")]
        q = (
            sa.select(Run.name.label("run"), other.name.label("other"), *columns)
            .join(Run, Run.id == HeadMatch.run_id)
            .join(other, other.id == HeadMatch.other_run_id)
        )
        if run is not None:
            q = q.where(HeadMatch.run_id == self.run_info(run).id)
        frame = self._frame(q.order_by(Run.name, other.name, HeadMatch.params, HeadMatch.layer, HeadMatch.head))
        return frame.astype({c: "Int64" for c in ("match_layer", "match_head", "best_layer", "best_head", "rank")})

    def probe_results(self) -> pd.DataFrame:
        """Saved probe results: run, eval_run, kind, uas, train_uas, n_train, n_eval, epochs, final_loss, params."""
        train, held_out = sa.orm.aliased(Run), sa.orm.aliased(Run)
        q = (
            sa.select(
                train.name.label("run"),
                held_out.name.label("eval_run"),
                ProbeResult.kind,
                ProbeResult.uas,
                ProbeResult.train_uas,
                ProbeResult.n_train,
                ProbeResult.n_eval,
                ProbeResult.epochs,
                ProbeResult.final_loss,
                ProbeResult.params,
                ProbeResult.created_at,
            )
            .join(train, train.id == ProbeResult.run_id)
            .join(held_out, held_out.id == ProbeResult.eval_run_id)
            .order_by(ProbeResult.id)
        )
        return self._frame(q)

    def model_row(self, name: str) -> dict | None:
        """The most recent model registered under `name` (id, name, source, init, task, parent_id, training, ...)."""
        with self.session() as s:
            m = s.scalars(sa.select(Model).where(Model.name == name).order_by(Model.id.desc())).first()
            return None if m is None else {c.name: getattr(m, c.name) for c in Model.__table__.columns}

    def models(self) -> pd.DataFrame:
        """Registered models: id, name, architecture, n_layers, n_heads, init, task, parent, training, created_at."""
        parent = sa.orm.aliased(Model)
        q = (
            sa.select(
                Model.id,
                Model.name,
                Model.architecture,
                Model.n_layers,
                Model.n_heads,
                Model.init,
                Model.task,
                parent.name.label("parent"),
                Model.training,
                Model.created_at,
            )
            .outerjoin(parent, parent.id == Model.parent_id)
            .order_by(Model.id)
        )
        return self._frame(q)

    def ablation_results(self, model: str | None = None, task: str | None = None) -> pd.DataFrame:
        """Stored evaluations and ablations: model, init, task, split, mode, config, disabled_heads, metric, score,
        baseline_score, delta (score - baseline), n_examples, and for a pruning step how its importance was estimated
        (importance_split, importance_examples, importance_schedule). Config "none" is the model's plain evaluation."""
        q = (
            sa.select(
                Model.name.label("model"),
                Model.init,
                AblationResult.task,
                AblationResult.split,
                AblationResult.mode,
                AblationResult.config,
                AblationResult.disabled_heads,
                AblationResult.metric,
                AblationResult.score,
                AblationResult.baseline_score,
                AblationResult.n_examples,
                AblationResult.importance_split,
                AblationResult.importance_examples,
                AblationResult.importance_schedule,
                AblationResult.created_at,
            )
            .join(Model, Model.id == AblationResult.model_id)
            .order_by(AblationResult.id)
        )
        if model is not None:
            q = q.where(Model.name == model)
        if task is not None:
            q = q.where(AblationResult.task == task)
        frame = self._frame(q)
        frame["delta"] = frame["score"] - frame["baseline_score"]
        return frame

    # ------------------------------------------------------------------ attention-pattern labels (Kovaleva et al. K1)

    def example_rows(self, run: RunRef) -> pd.DataFrame:
        """A run's examples with their row in the original corpus.

        Columns: example (position), example_id, source_row (examples.source_index where the
        corpus numbers its rows, e.g. a sampled GLUE set, else the position), length, skipped.
        """
        info = self.run_info(run)
        q = (
            sa.select(
                Example.position.label("example"), Example.id.label("example_id"), Example.source_index, Sequence.length, Sequence.skipped
            )
            .join(Sequence, Sequence.example_id == Example.id)
            .where(self._visible(info))
            .order_by(Example.position)
        )
        frame = self._frame(q)
        index = pd.to_numeric(frame["source_index"], errors="coerce")
        frame["source_row"] = index.where(index.notna(), frame["example"]).astype("int64")
        return frame[["example", "example_id", "source_row", "length", "skipped"]]

    def pattern_labels(self, run: RunRef | None = None, source: str | None = None) -> pd.DataFrame:
        """Saved attention-pattern labels (Kovaleva et al. K1), one row per (run, example, layer, head, source).

        Columns: run, model, dataset, split, example (position), example_id, source_row, layer,
        head, label, source ("human", "rules", "cnn", ...), confidence, created_at.
        """
        from .schema import PatternLabel  # imported here so this block stays self-contained

        q = (
            sa.select(
                Run.name.label("run"),
                Model.name.label("model"),
                Dataset.name.label("dataset"),
                Dataset.split,
                Example.position.label("example"),
                PatternLabel.example_id,
                Example.source_index,
                PatternLabel.layer,
                PatternLabel.head,
                PatternLabel.label,
                PatternLabel.source,
                PatternLabel.confidence,
                PatternLabel.created_at,
            )
            .join(Run, Run.id == PatternLabel.run_id)
            .join(Model, Model.id == Run.model_id)
            .join(Dataset, Dataset.id == Run.dataset_id)
            .join(Example, Example.id == PatternLabel.example_id)
            .order_by(Run.id, Example.position, PatternLabel.layer, PatternLabel.head, PatternLabel.source)
        )
        if run is not None:
            q = q.where(PatternLabel.run_id == self.run_info(run).id)
        if source is not None:
            q = q.where(PatternLabel.source == source)
        frame = self._frame(q)
        index = pd.to_numeric(frame["source_index"], errors="coerce")
        frame.insert(6, "source_row", index.where(index.notna(), frame["example"]).astype("int64"))
        return frame.drop(columns="source_index")
