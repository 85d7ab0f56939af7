"""Where a dataset's examples come from: a user's corpus file, a built-in dataset read from the data directory, or a
dataset generated from the model's tokenizer (ingest/generated.py). A `CorpusSource` says what identifies them (format,
checksum, reading options: store/identity.py) and reads them."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .corpus import FORMAT_READERS, file_checksum, read_corpus
from .datasets import dataset_path, find_dataset, path_checksum, resolve_data_dir
from .errors import CorpusError
from .generated import HAYSTACK, NEEDLE, NeedleHaystack, RepeatedTokens

if TYPE_CHECKING:
    from .model import LoadedModel


@dataclass(frozen=True)
class CorpusSource:
    """Where a dataset's examples come from: a user's file or a built-in dataset."""

    name: str
    split: str
    fmt: str
    source: str
    checksum: str
    gold: bool
    read: Callable[[], Iterator]
    license: str | None = None
    options: dict = field(default_factory=dict)


def reading_options(reader: Callable[..., Iterator] | None, options: dict) -> dict:
    """The reading options that decide a reader's examples, canonical: those given (None = not given), with
    the reader's other defaults filled in, and without options the reader does not take (read_corpus
    ignores them). Stored as the dataset's options and part of its identity (store/identity.py)."""
    given = {k: v for k, v in options.items() if v is not None}
    if reader is None:
        return given
    params = list(inspect.signature(reader).parameters.values())[1:]  # after the path
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        names = {p.name for p in params}
        given = {k: v for k, v in given.items() if k in names}
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty and p.default is not None}
    return {**defaults, **given}


def file_source(corpus: str, fmt: str, name: str | None = None, split: str | None = None, **read_options) -> CorpusSource:
    path = Path(corpus)
    if not path.is_file():
        raise CorpusError(path, None, "no such file", "check the --corpus path")
    return CorpusSource(
        name=name or path.parent.name or "corpus",
        split=split or path.stem,
        fmt=fmt,
        source=str(path.resolve()),
        checksum=file_checksum(path),
        gold=fmt == "conllu",
        read=lambda: read_corpus(path, fmt, **read_options),
        options=reading_options(FORMAT_READERS.get(fmt), read_options),
    )


def builtin_source(key: str, data_dir: str | None = None, **overrides) -> CorpusSource:
    spec = find_dataset(key)
    root = resolve_data_dir(data_dir)
    path = dataset_path(spec, root)
    options = {**spec.options, **{k: v for k, v in overrides.items() if v is not None}}
    return CorpusSource(
        name=spec.name,
        split=spec.split,
        fmt=spec.reader.__name__,
        source=str(path.resolve()),
        checksum=path_checksum(path),
        gold=spec.annotation == "gold",
        read=lambda: spec.reader(path, **options),
        license=spec.license,
        options=reading_options(spec.reader, options),  # the label map too: it changes the labels
    )


def generated_source(
    key: str, loaded: LoadedModel, *, seed: int = 0, max_length: int | None = None, data_dir: str | None = None
) -> CorpusSource:
    """A generated dataset (ingest/generated.py) for this model's tokenizer: `generated/repeated_tokens:T20,50,200`, or
    `generated/needle:L1000,2000` (its haystack: GUM's documents, from the data directory)."""
    name, _, split = key.partition(":")
    generator: RepeatedTokens | NeedleHaystack
    if name == NEEDLE:
        documents = [e.text_a for e in builtin_source(HAYSTACK, data_dir, window_words=0).read()]
        generator = NeedleHaystack(loaded.tokenizer, split, documents, model=loaded.name, max_length=max_length)
        fmt, split_name = "needle", split
    else:
        generator = RepeatedTokens(loaded.tokenizer, split, model=loaded.name, seed=seed, max_length=max_length)
        fmt, split_name = "repeated_tokens", f"{split}-seed{seed}"
    return CorpusSource(
        name=name,
        split=split_name,
        fmt=fmt,
        source=f"generated from {loaded.name}'s tokenizer",
        checksum=generator.checksum(),
        gold=False,
        read=generator.read,
        license=f"the haystack's: {find_dataset(HAYSTACK).license}" if name == NEEDLE else "generated (no license needed)",
        options=generator.options,
    )
