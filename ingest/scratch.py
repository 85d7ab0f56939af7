"""Type a sentence and look: one sentence (or pair) through a model, its tokens and every map, without an ingest.

`attention_for_text(model, text, text_b=None)` returns what `attnstore ingest` would store for that sentence: the
same annotation into words (`annotate`), the same tokenizer call (`align.encode_batch`, raw text or words as the
run's `tokenization` says), the same forward pass (`passes.forward_attention`, stopping at the last map) and the same
checked conversion to the stored dtype (`passes.to_blocks`). A sentence ingested alone in its batch is stored with
exactly these values (tests/ingest/test_scratch.py compares them bit for bit); in a batch beside longer examples, the
padding can move a float16 value by one unit in the last place, as it does between two ingests batched differently.

`attention_for_run(store, run, text, text_b)` does it with a stored run's model and settings (model, tokenization,
max_length, truncation, dtype), which is what `attnstore serve`'s text box (POST /api/runs/RUN/scratch) and
`attnstore view --run RUN --text ...` run. Models are loaded once per process and kept (`cached_model`).

Needs the ingest extra (torch, transformers): `require_model_runtime` says so in one line without it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..store.errors import InvalidArgumentError, TooLargeError
from .errors import ModelError

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo
    from .model import LoadedModel

MODEL_RUNTIME = ("torch", "transformers")
KEPT_MODELS = 4  # models kept loaded in one process (least recently used first out)


class ModelRuntimeMissingError(ModelError):
    """The ingest extra (torch, transformers) is not installed: no model can be run in this process."""


def require_model_runtime() -> None:
    """Raise ModelRuntimeMissingError (one line naming the extra) when torch or transformers cannot be imported."""
    import importlib

    for module in MODEL_RUNTIME:
        try:
            importlib.import_module(module)
        except ImportError:
            raise ModelRuntimeMissingError(
                f"running a model on typed text needs the 'ingest' extra ({module} is not installed): "
                "pip install torch==2.13.0 'attnstore[ingest]'"
            ) from None


@dataclass
class ScratchMaps:
    """One typed sentence (or pair) through a model: what an ingest would store for it."""

    model: str
    text: str
    text_b: str | None
    tokens: list[dict]  # token, token_id, word_position, segment, is_special, char_start, char_end (as store.tokens)
    words: list[dict]  # form, position, segment, char_start, char_end (and upos, head, deprel with spaCy)
    attention: np.ndarray  # (layer, head, query, key) in `dtype`, unpadded
    truncated: bool
    full_length: int  # tokens before truncation
    tokenization: str
    max_length: int
    dtype: str
    seconds: float  # tokenizing and the forward pass
    settings: dict = field(default_factory=dict)

    @property
    def token_texts(self) -> list[str]:
        return [t["token"] for t in self.tokens]

    @property
    def special(self) -> list[bool]:
        return [bool(t["is_special"]) for t in self.tokens]


_models: dict[str, LoadedModel] = {}
_models_lock = threading.Lock()  # one model loaded at a time; the cache behind it
_annotators: dict[str, Any] = {}


def cached_model(name_or_path: str) -> LoadedModel:
    """`load_model(name_or_path)`, loaded once per process and kept (the `KEPT_MODELS` most recently used)."""
    require_model_runtime()
    from .model import load_model

    with _models_lock:
        if name_or_path in _models:
            _models[name_or_path] = _models.pop(name_or_path)  # most recently used last
            return _models[name_or_path]
        loaded = load_model(name_or_path)
        _models[name_or_path] = loaded
        while len(_models) > KEPT_MODELS:
            _models.pop(next(iter(_models)))
        return loaded


def _annotator(kind: str):
    from .annotate import make_annotator

    with _models_lock:
        if kind not in _annotators:
            _annotators[kind] = make_annotator(kind)
        return _annotators[kind]


def forward_like_ingest(loaded: LoadedModel, encoded):
    """The forward pass of one encoded example on a thread with the torch threads of one of ingest's forward passes
    (`passes.forward_passes`): the sums of a matrix product depend on how many threads share it, so on another
    thread count a float16 value can move by one unit in the last place (3 of 10,368 on a 9-word sentence with 2
    threads against ingest's 1 per pass on 2 cores). torch's thread count is per thread, so the caller's and other
    threads' are left as they are."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from .passes import forward_attention, forward_passes

    _, threads = forward_passes()
    with ThreadPoolExecutor(1, "attnstore-scratch", initializer=torch.set_num_threads, initargs=(threads,)) as pool:
        return pool.submit(forward_attention, loaded, [encoded]).result()


def attention_for_text(
    model: LoadedModel | str,
    text: str,
    text_b: str | None = None,
    *,
    tokenization: str = "text",
    max_length: int | None = None,
    truncation: str = "truncate",
    dtype: str = "float16",
    annotator: str = "whitespace",
    max_tokens: int | None = None,
) -> ScratchMaps:
    """The tokens and (layer, head, L, L) maps `attnstore ingest` would store for `text` (and `text_b`, a pair).

    `model`: a LoadedModel, or a name or directory (loaded once per process: `cached_model`). `tokenization`,
    `max_length` (default: the model's limit), `truncation` ("truncate", or "skip": refused when too long) and
    `dtype` as the ingest options of the same names; `annotator` ("whitespace" or "spacy") splits the text into
    words, which tokens are aligned to (the maps do not depend on it with tokenization="text"). A text is read as
    one corpus line: tabs and line breaks become spaces, and it is stripped. `max_tokens`: refuse (TooLargeError)
    a text of more tokens than that before running the model."""
    require_model_runtime()
    from ..store import arrays
    from ..store.records import ExampleInput, StoredExample
    from .align import TOKENIZATIONS, TRUNCATION_POLICIES, encode_batch
    from .annotate import annotate
    from .passes import to_blocks

    loaded = cached_model(model) if isinstance(model, str) else model
    text, text_b = clean_text(text), clean_text(text_b) or None
    if not text:
        raise InvalidArgumentError("give a sentence: the text is empty")
    if tokenization not in TOKENIZATIONS:
        raise InvalidArgumentError(f"tokenization must be one of {TOKENIZATIONS}, not {tokenization!r}")
    if truncation not in TRUNCATION_POLICIES:
        raise InvalidArgumentError(f"truncation must be one of {TRUNCATION_POLICIES}, not {truncation!r}")
    if dtype not in arrays.DTYPES:
        raise InvalidArgumentError(f"dtype must be one of {arrays.DTYPES}, not {dtype!r}")
    limit = loaded.max_length if max_length is None else min(int(max_length), loaded.max_length)
    started = time.perf_counter()
    (annotated,) = annotate([ExampleInput(position=0, text_a=text, text_b=text_b)], _annotator(annotator))
    if not any(w["segment"] == 0 for w in annotated.words):
        raise InvalidArgumentError("give a sentence: the text has no words")
    example = StoredExample(id=0, position=0, text_a=text, text_b=text_b, words=annotated.words)
    (encoded,) = encode_batch(loaded.tokenizer_for(tokenization), [example], limit, truncation, tokenization)
    if not encoded.input_ids:
        raise InvalidArgumentError(f"the text is {encoded.full_length} tokens, longer than the {limit} this run stores (truncation=skip)")
    if max_tokens is not None and encoded.length > max_tokens:
        raise TooLargeError(f"the typed text is {encoded.length} tokens, over the limit of {max_tokens} tokens")
    attentions, lengths = forward_like_ingest(loaded, encoded)
    (maps,) = to_blocks(attentions, lengths, dtype, [encoded], loaded.sink_logits)
    seconds = time.perf_counter() - started
    return ScratchMaps(
        model=loaded.name,
        text=text,
        text_b=text_b,
        tokens=[dict(t) for t in encoded.tokens],
        words=[dict(w) for w in annotated.words],
        attention=np.array(maps),  # its own copy: to_blocks' blocks are views of the batch's array
        truncated=encoded.truncated,
        full_length=encoded.full_length,
        tokenization=tokenization,
        max_length=limit,
        dtype=dtype,
        seconds=seconds,
        settings=dict(annotator=annotator, truncation=truncation),
    )


def clean_text(text: str | None) -> str:
    """A typed text as one corpus line: tabs and line breaks as spaces, stripped."""
    return (text or "").translate({9: " ", 10: " ", 13: " "}).strip()


def model_source(info: RunInfo) -> str:
    """Where a run's model loads from: a packaged model by its name; else the local directory its manifest records (a
    fine-tuned or saved model), else the name it was run under (the Hugging Face cache)."""
    from pathlib import Path

    from .model import PACKAGED

    if info.model in PACKAGED:
        return info.model
    recorded = ((info.manifest or {}).get("model") or {}).get("source")
    if isinstance(recorded, str) and recorded and Path(recorded).is_dir() and (Path(recorded) / "config.json").is_file():
        return recorded
    return info.model


def run_model(info: RunInfo) -> LoadedModel:
    """The run's model, loaded once per process (`cached_model`)."""
    return cached_model(model_source(info))


def attention_for_run(
    store: Store, run: str, text: str, text_b: str | None = None, *, annotator: str = "whitespace", max_tokens: int | None = None
) -> ScratchMaps:
    """`attention_for_text` with run `run`'s model and settings (tokenization, max_length, truncation, dtype):
    the maps that run would hold for this sentence. `settings["weights_match"]` says whether the loaded weights
    are those the run was computed with (its manifest's weights_sha256)."""
    info = store.run_info(run)
    loaded = run_model(info)
    maps = attention_for_text(
        loaded,
        text,
        text_b,
        tokenization=info.tokenization,
        max_length=info.max_length,
        truncation=info.truncation,
        dtype=info.dtype,
        annotator=annotator,
        max_tokens=max_tokens,
    )
    maps.model = info.model  # the name the run knows it by (a model loaded from a directory is named after the folder)
    recorded = ((info.manifest or {}).get("model") or {}).get("weights_sha256")
    maps.settings.update(run=info.name, weights_match=None if not recorded else recorded == loaded.weights_sha256)
    if (loaded.n_layers, loaded.n_heads) != (info.n_layers, info.n_heads):
        raise ModelError(
            f"model {loaded.name!r} loaded for run {info.name!r} has {loaded.n_layers} layers x {loaded.n_heads} heads, "
            f"the run {info.n_layers} x {info.n_heads}: not the run's model"
        )
    return maps


def save_scratch(store: Store, run: str, text: str, text_b: str | None = None, *, annotator: str = "whitespace") -> RunInfo:
    """Keep a typed sentence as a run of its own, ingested (`ingest`) with run `run`'s model and settings: run
    "scratch/RUN/DIGEST" over a one-example dataset "scratch", split DIGEST (the first 12 hex digits of the text's
    sha256). Saving the same sentence again finds that run complete. Returns the run."""
    import hashlib
    import tempfile
    from pathlib import Path

    from .runner import ingest

    info = store.run_info(run)
    text, text_b = clean_text(text), clean_text(text_b) or None
    if not text:
        raise InvalidArgumentError("give a sentence: the text is empty")
    digest = hashlib.sha256(f"{text}\t{text_b or ''}".encode()).hexdigest()[:12]
    loaded = run_model(info)
    with tempfile.TemporaryDirectory(prefix="attnstore-scratch-") as folder:
        corpus = Path(folder) / f"typed-{digest}.tsv"
        if text_b is None:
            corpus.write_text(f"sentence\n{text}\n", encoding="utf-8")
        else:
            corpus.write_text(f"sentence1\tsentence2\n{text}\t{text_b}\n", encoding="utf-8")
        result = ingest(
            store,
            corpus=str(corpus),
            fmt="tsv" if text_b is None else "pairs-tsv",
            dataset_name="scratch",
            split=digest,
            annotator=annotator,
            name=f"scratch/{info.name}/{digest}",
            tokenization=info.tokenization,
            max_length=info.max_length,
            truncation=info.truncation,
            dtype=info.dtype,
            value_norms=False,
            loaded=loaded,
            progress=False,
        )
    return result.run
