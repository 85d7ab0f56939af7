"""Built-in datasets: the corpora of the two papers, read from a data directory.

`attnstore ingest --dataset glue/MRPC:dev` resolves a name here. The data directory is
`--data-dir` > `ATTNSTORE_DATA` > `../shared/data` (a development convenience: the
folder beside a checkout). Files keep their upstream formats; see the data README.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..store.records import ExampleInput
from .coref import DEFAULT_WINDOW_WORDS, read_gum_documents
from .corpus import read_conllu, read_pairs_tsv, read_tsv
from .errors import InvalidArgumentError, NotFoundError
from .framenet import read_exemplars_jsonl

ENV_DATA = "ATTNSTORE_DATA"
RTE_LABELS = {"0": "entailment", "1": "not_entailment"}


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    split: str
    path: str  # relative to the data directory (a file, or a folder for GUM)
    reader: Callable[..., Iterator[ExampleInput]]
    options: dict = field(default_factory=dict)
    license: str = ""
    source: str = ""
    n_examples: int = 0  # what the shared files hold (checked by tests/ingest/test_datasets_full.py)
    unit: str = "examples"
    annotation: str = "spacy"  # gold | spacy

    @property
    def key(self) -> str:
        return f"{self.name}:{self.split}"


def _glue(task, split, file, n, license, source, single=False, **options):
    reader = read_tsv if single else read_pairs_tsv
    return DatasetSpec(f"glue/{task}", split, f"glue/{task}/{file}", reader, options, license, source, n)


MRPC_LICENSE = "MSR Shared Source License (research, non-commercial)"
BUILTIN: list[DatasetSpec] = [
    _glue("MRPC", "dev", "dev.tsv", 408, MRPC_LICENSE, "Nstats/my_bert data/MRPC", text_a="#1 String", text_b="#2 String", label="Quality"),
    _glue(
        "MRPC",
        "train",
        "train.tsv",
        3668,
        MRPC_LICENSE,
        "Nstats/my_bert data/MRPC",
        text_a="#1 String",
        text_b="#2 String",
        label="Quality",
    ),
    _glue(
        "RTE",
        "dev",
        "dev.tsv",
        277,
        "RTE challenge data (research use)",
        "HF export, Ji-Yishan/MIEC-FYP",
        text_a="sentence1",
        text_b="sentence2",
        label="label",
        index="idx",
        quoting="csv",
        label_map=RTE_LABELS,
    ),
    _glue(
        "RTE",
        "train",
        "train.tsv",
        2490,
        "RTE challenge data (research use)",
        "HF export, Ji-Yishan/MIEC-FYP",
        text_a="sentence1",
        text_b="sentence2",
        label="label",
        index="idx",
        quoting="csv",
        label_map=RTE_LABELS,
    ),
    _glue(
        "STS-B",
        "dev",
        "dev.tsv",
        1500,
        "scores CC BY-SA 4.0; texts vary",
        "korjak/sts-dev",
        text_a="sentence1",
        text_b="sentence2",
        label="score",
        index="index",
    ),
    _glue(
        "STS-B",
        "train",
        "train.tsv",
        5749,
        "scores CC BY-SA 4.0; texts vary",
        "korjak/sts-dev",
        text_a="sentence1",
        text_b="sentence2",
        label="score",
        index="index",
    ),
    _glue(
        "SST-2",
        "dev",
        "dev.tsv",
        872,
        "Stanford Sentiment Treebank (research use)",
        "forest-snow/alps",
        single=True,
        text_a="sentence",
        label="label",
    ),
    _glue(
        "SST-2",
        "train",
        "train.tsv",
        67349,
        "Stanford Sentiment Treebank (research use)",
        "TaoCesc/binary_cls",
        single=True,
        text_a="text",
        label="label",
    ),
    _glue(
        "QNLI",
        "dev",
        "dev.tsv",
        5463,
        "CC BY-SA 4.0 (from SQuAD)",
        "jonny-vr/LLMCBench",
        text_a="question",
        text_b="sentence",
        label="label",
        index="index",
    ),
    _glue(
        "MNLI",
        "dev-matched-sample",
        "dev_matched_sample1024.tsv",
        1024,
        "MultiNLI (OANC, some CC BY 3.0)",
        "sample of GLUE dev_matched, rohitdutta2510/LLM-Cascade",
        text_a="premise",
        text_b="hypothesis",
        label="label_text",
        index="idx",
    ),
    *[
        DatasetSpec(
            "ud/en_ewt",
            split,
            f"ud_english_ewt/en_ewt-ud-{split}.conllu",
            read_conllu,
            {},
            "CC BY-SA 4.0",
            "UniversalDependencies/UD_English-EWT",
            n,
            "sentences",
            "gold",
        )
        for split, n in (("dev", 2001), ("test", 2077), ("train", 12544))
    ],
    *[
        DatasetSpec(
            "gum/ontogum",
            split,
            f"gum_ontogum/{split}",
            read_gum_documents,
            {"window_words": DEFAULT_WINDOW_WORDS},
            "annotations CC BY 4.0; texts vary by genre (some NC)",
            "amir-zeldes/gum coref/ontogum",
            30,
            "documents",
            "gold",
        )
        for split in ("dev", "test")
    ],
    DatasetSpec(
        "framenet/1.5",
        "exemplars",
        "framenet_v15/derived/lu_exemplars_max12tok.jsonl",
        read_exemplars_jsonl,
        {},
        "FrameNet 1.5 (non-commercial use)",
        "dasmith/FrameNet-python fndata-1.5 (derived)",
        22436,
        "annotation sets",
    ),
]


def find_dataset(key: str) -> DatasetSpec:
    for spec in BUILTIN:
        if spec.key == key:
            return spec
    known = ", ".join(s.key for s in BUILTIN)
    raise InvalidArgumentError(f"no built-in dataset {key!r}; choose one of: {known}")


def resolve_data_dir(option: str | None = None) -> Path:
    """--data-dir > ATTNSTORE_DATA > ../shared/data from the working directory (the layout of a checkout with
    the data beside it). Never guessed from where the package is installed."""
    if option or os.environ.get(ENV_DATA):
        return Path(option or os.environ[ENV_DATA]).expanduser()
    return Path.cwd().parent / "shared" / "data"


def dataset_path(spec: DatasetSpec, data_dir: Path) -> Path:
    path = data_dir / spec.path
    if not path.exists():
        raise NotFoundError(f"{spec.key}: {path} not found; pass --data-dir (or set {ENV_DATA}) to the folder holding {spec.path}")
    return path


def read_dataset(spec: DatasetSpec, data_dir: Path, **overrides) -> Iterator[ExampleInput]:
    return spec.reader(dataset_path(spec, data_dir), **{**spec.options, **overrides})


def path_checksum(path: Path) -> str:
    """sha256 of a file, or of a folder's files (names and contents, sorted)."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
