"""Bad input of every kind: one `Error: ...` line naming the file/line and the fix, exit code 1, no traceback,
and nothing written to the store.

One table, CASES, drives the command line (click's CliRunner). To add a case, append a
`Case(id, build, expect)`: `build(env)` writes whatever bad input it needs under `env.tmp` and
returns the `attnstore` arguments (store options are added by the test); `expect` is a
substring of the one-line message, formatted with `tmp=env.tmp`. Helpers below build the
usual arguments: `corpus_args` (a corpus file), `dataset_args` (a built-in dataset in a
copy of tests/fixtures/data), `model_args` (a broken copy of a tiny random BERT) and
`query_args`. No case downloads anything or loads the real default model.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from attnstore.api.cli import main

FIXTURE_DATA = Path(__file__).parent / "fixtures" / "data"
COUNTED_TABLES = ("datasets", "examples", "models", "runs")


@dataclass
class Env:
    tmp: Path
    model: str  # a tiny random BERT that loads: the model every corpus case passes
    monkeypatch: pytest.MonkeyPatch

    @property
    def store_args(self) -> list[str]:
        return ["--db", f"sqlite:///{self.tmp / 'meta.sqlite'}", "--root", str(self.tmp / "attention.zarr")]


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[Env], list[str]]
    expect: str
    store_unchanged: bool = True  # rows counted in COUNTED_TABLES and run folders under the array root
    store_args: bool = True  # False: the case gives its own --db/--root
    then: Callable[[Env], list[str]] | None = None  # a command that must succeed afterwards (nothing left unusable)


# ---------------------------------------------------------------- helpers that build inputs


def word(i, head, form=None, misc="_"):
    """One CoNLL-U word line."""
    form = form or f"w{i}"
    return f"{i}\t{form}\t{form}\tX\tX\t_\t{head}\tdep\t_\t{misc}\n"


# A good sentence with a multiword token and an empty node (lines 1-7), then a blank line: bad sentences follow at line 9.
GOOD_SENTENCE = (
    "# sent_id = good\n# text = don't go\n1-2\tdon't\t_\t_\t_\t_\t_\t_\t_\t_\n"
    + word(1, 3, "do")
    + word(2, 3, "n't")
    + word(3, 0, "go")
    + "3.1\tgo\tgo\tX\tX\t_\t_\t_\t3:dep\t_\n\n"
)


def ingest_args(env: Env, *args: str, model: str | None = None) -> list[str]:
    return ["ingest", *args, "--annotate", "whitespace", "--no-progress", "--model", model or env.model]


def corpus_args(name: str, data: str | bytes, fmt: str, *extra: str) -> Callable[[Env], list[str]]:
    def build(env: Env) -> list[str]:
        path = env.tmp / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
        return ingest_args(env, "--corpus", str(path), "--format", fmt, *extra)

    return build


def dataset_args(key: str, files: dict[str, Callable[[bytes], bytes] | str | bytes]) -> Callable[[Env], list[str]]:
    """A copy of tests/fixtures/data with some files replaced (str/bytes) or changed (a function of the old bytes)."""

    def build(env: Env) -> list[str]:
        data = env.tmp / "data"
        shutil.copytree(FIXTURE_DATA, data)
        for rel, change in files.items():
            path = data / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            new = change(path.read_bytes()) if callable(change) else change
            path.write_bytes(new if isinstance(new, bytes) else new.encode("utf-8"))
        return ingest_args(env, "--dataset", key, "--data-dir", str(data))

    return build


def on_line(n: int, change: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
    """Change line n (1-based) of a file."""

    def apply(old: bytes) -> bytes:
        lines = old.splitlines(keepends=True)
        lines[n - 1] = change(lines[n - 1])
        return b"".join(lines)

    return apply


def nul_at(column: int) -> Callable[[bytes], bytes]:
    return lambda line: line[: column - 1] + b"\x00" + line[column - 1 :]


def model_args(change: Callable[[Path], None]) -> Callable[[Env], list[str]]:
    """A good text corpus and a copy of the tiny model broken by `change(model_dir)`."""

    def build(env: Env) -> list[str]:
        corpus = env.tmp / "ok.txt"
        corpus.write_text("the cat sat.\n", encoding="utf-8")
        broken = env.tmp / "broken-model"
        shutil.copytree(env.model, broken)
        change(broken)
        return ingest_args(env, "--corpus", str(corpus), "--format", "text", model=str(broken))

    return build


def keep_only(*names: str) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        for p in folder.iterdir():
            if p.name not in names:
                p.unlink()

    return change


def truncate(name: str) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: len(data) // 2])

    return change


def garbage_bin(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"this is not a checkpoint\n" * 40)


def bad_config(folder: Path) -> None:
    (folder / "config.json").write_text('{"model_type": "bert",', encoding="utf-8")


def query_args(name: str, *params: str, register: Callable | None = None) -> Callable[[Env], list[str]]:
    """`attnstore query NAME --param ...` on a run that does not exist (parameters are checked first).
    `register`: a function to register as query NAME for this test only."""

    def build(env: Env) -> list[str]:
        if register is not None:
            from attnstore.queries import QUERIES, QuerySpec, load_all

            load_all()
            env.monkeypatch.setitem(QUERIES, name, QuerySpec(name, register, "test query", True))
        return ["query", name, "--run", "no-such-run", *[a for p in params for a in ("--param", p)]]

    return build


def not_a_database(env: Env) -> list[str]:
    path = env.tmp / "not-a-db.txt"
    path.write_text("just some text, long enough to fill a SQLite header page " * 20, encoding="utf-8")
    return ["--db", str(path), "--root", str(env.tmp / "attention.zarr")]


def newer_schema(*command: str) -> Callable[[Env], list[str]]:
    """A store whose schema a newer attnstore migrated (an alembic revision this one does not know)."""

    def build(env: Env) -> list[str]:
        engine = sa.create_engine(f"sqlite:///{env.tmp / 'meta.sqlite'}")
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
        engine.dispose()
        return list(command)

    return build


def flags_query(store, *, run, smooth: bool = False, top: int | None = None, scale: Optional[float] = None):  # noqa: F821
    """A query with bool and Optional parameters (none of the stored queries has a bool yet)."""
    raise AssertionError("parameters must be rejected before the query runs")


# ---------------------------------------------------------------- the table

CASES: list[Case] = [
    # CoNLL-U trees (a good sentence with a multiword token and an empty node first: bad sentence at line 9)
    Case(
        "conllu-cycle",
        corpus_args("bad.conllu", GOOD_SENTENCE + "# sent_id = s2\n" + word(1, 0) + word(2, 3) + word(3, 2), "conllu"),
        "bad.conllu:9: dependency cycle in sentence 's2': words 2 -> 3 -> 2 (word 2 is on line 11); "
        "fix the HEAD column so every word leads to the root (HEAD 0)",
    ),
    Case(
        "conllu-self-loop",
        corpus_args("bad.conllu", GOOD_SENTENCE + word(1, 0) + word(2, 2), "conllu"),
        "bad.conllu:9: dependency cycle in the sentence: words 2 -> 2",
    ),
    Case(
        "conllu-no-root",
        corpus_args("bad.conllu", GOOD_SENTENCE + "# sent_id = s2\n" + word(1, 2) + word(2, 1), "conllu"),
        "bad.conllu:9: sentence 's2' has no root (no word with HEAD 0); give its main word HEAD 0",
    ),
    Case(
        "conllu-two-roots",
        corpus_args("bad.conllu", GOOD_SENTENCE + word(1, 0) + word(2, 0) + word(3, 1), "conllu"),
        "bad.conllu:9: the sentence has 2 roots: words 1 (line 9), 2 (line 10) have HEAD 0; give exactly one word HEAD 0",
    ),
    Case(
        "conllu-head-outside-sentence",
        corpus_args("bad.conllu", GOOD_SENTENCE + word(1, 0) + word(2, 7), "conllu"),
        "bad.conllu:10: HEAD 7 points past the sentence's 2 words; HEAD must be 0 (root) or the ID of a word",
    ),
    Case(
        "conllu-head-not-ascii-digit",
        corpus_args("bad.conllu", word(1, 0) + word(2, "\u00b2"), "conllu"),
        "bad.conllu:2: HEAD '\u00b2' is not a number",
    ),
    Case(
        "ud-ewt-dataset-cycle",
        dataset_args(
            "ud/en_ewt:dev", {"ud_english_ewt/en_ewt-ud-dev.conllu": on_line(7, lambda line: line.replace(b"\t4\tobl\t", b"\t1\tobl\t"))}
        ),
        "en_ewt-ud-dev.conllu:1: dependency cycle in sentence 'weblog-blogspot.com_nominations_20041117172713_ENG_20041117_172713-0001': "
        "words 1 -> 3 -> 1 (word 1 is on line 5)",
    ),
    Case(
        "gum-dataset-no-root",
        dataset_args(
            "gum/ontogum:dev", {"gum_ontogum/dev/GUM_zz_bad.conllu": "# newdoc id = bad\n# sent_id = bad-1\n" + word(1, 2) + word(2, 1)}
        ),
        "GUM_zz_bad.conllu:1: sentence 'bad-1' has no root",
    ),
    # NUL bytes, in every format and every built-in reader
    Case(
        "nul-text",
        corpus_args("nul.txt", b"fine\nca\x00t\n", "text"),
        "nul.txt:2: NUL byte (\\x00) at column 3; remove the NUL byte (e.g. tr -d '\\000' < IN > OUT); PostgreSQL cannot store NUL",
    ),
    Case("nul-tsv", corpus_args("nul.tsv", b"sentence\tlabel\nok\t1\nbad\x00\t0\n", "tsv"), "nul.tsv:3: NUL byte (\\x00) at column 4"),
    Case("nul-pairs-tsv", corpus_args("nul.tsv", b"sentence1\tsentence2\nA\tB\x00\n", "pairs-tsv"), "nul.tsv:2: NUL byte"),
    Case(
        "nul-pairs-tsv-csv-quoting",
        corpus_args("nul.tsv", b'sentence1\tsentence2\n"A\tx"\t"B\x00"\n', "pairs-tsv", "--quoting", "csv"),
        "nul.tsv:2: NUL byte",
    ),
    Case(
        "nul-conllu",
        corpus_args("nul.conllu", (GOOD_SENTENCE + word(1, 0, "a\x00b")).encode(), "conllu"),
        "nul.conllu:9: NUL byte (\\x00) at column 4",
    ),
    Case(
        "nul-dataset-mrpc",
        dataset_args("glue/MRPC:dev", {"glue/MRPC/dev.tsv": on_line(3, nul_at(5))}),
        "dev.tsv:3: NUL byte (\\x00) at column 5",
    ),
    Case("nul-dataset-sst2", dataset_args("glue/SST-2:dev", {"glue/SST-2/dev.tsv": on_line(2, nul_at(1))}), "dev.tsv:2: NUL byte"),
    Case("nul-dataset-rte-csv", dataset_args("glue/RTE:dev", {"glue/RTE/dev.tsv": on_line(2, nul_at(3))}), "dev.tsv:2: NUL byte"),
    Case(
        "nul-dataset-ud-ewt",
        dataset_args("ud/en_ewt:dev", {"ud_english_ewt/en_ewt-ud-dev.conllu": on_line(6, nul_at(3))}),
        "en_ewt-ud-dev.conllu:6: NUL byte",
    ),
    Case(
        "nul-dataset-gum",
        dataset_args("gum/ontogum:dev", {"gum_ontogum/dev/GUM_bio_byron.conllu": on_line(10, nul_at(2))}),
        "GUM_bio_byron.conllu:10: NUL byte",
    ),
    Case(
        "nul-dataset-framenet",
        dataset_args("framenet/1.5:exemplars", {"framenet_v15/derived/lu_exemplars_max12tok.jsonl": on_line(2, nul_at(20))}),
        "lu_exemplars_max12tok.jsonl:2: NUL byte",
    ),
    Case(
        "nul-escape-dataset-framenet",
        dataset_args(
            "framenet/1.5:exemplars",
            {"framenet_v15/derived/lu_exemplars_max12tok.jsonl": on_line(1, lambda line: line.replace(b'"What', b'"Wh\\u0000at'))},
        ),
        "lu_exemplars_max12tok.jsonl:1: NUL character (U+0000) in the record; remove it",
    ),
    Case(
        "nul-dataset-framenet-frames",
        dataset_args("framenet/1.5:exemplars", {"framenet_v15/derived/frames.jsonl": on_line(1, nul_at(2))}),
        "frames.jsonl:1: NUL byte",
    ),
    # encodings
    Case(
        "latin1-text",
        corpus_args("latin.txt", "ok\nna\u00efve\n".encode("latin-1"), "text"),
        "latin.txt:2: not valid UTF-8 (byte 0xef at column 3); re-encode the file as UTF-8",
    ),
    Case(
        "utf16-bom-text",
        corpus_args("u16.txt", "caf\u00e9\n".encode("utf-16"), "text"),
        "u16.txt:1: the file is UTF-16 (it starts with a UTF-16 byte-order mark), not UTF-8; re-encode it as UTF-8",
    ),
    Case(
        "utf16-no-bom-conllu",
        corpus_args("u16.conllu", word(1, 0).encode("utf-16-le"), "conllu"),
        "u16.conllu:1: NUL byte (\\x00) at column 2; the file looks like UTF-16: re-encode it as UTF-8",
    ),
    # models: checked before the corpus is stored, so nothing is written
    Case(
        "model-config-only",
        model_args(keep_only("config.json")),
        "model directory {tmp}/broken-model has no weights (model.safetensors or pytorch_model.bin) and no tokenizer "
        "(tokenizer.json, vocab.txt, ...); save into it with model.save_pretrained",
    ),
    Case(
        "model-no-tokenizer",
        model_args(keep_only("config.json", "model.safetensors")),
        "model directory {tmp}/broken-model has no tokenizer (tokenizer.json, vocab.txt, ...); save into it with "
        "tokenizer.save_pretrained('{tmp}/broken-model')",
    ),
    Case(
        "model-truncated-safetensors",
        model_args(truncate("model.safetensors")),
        "weights file {tmp}/broken-model/model.safetensors is corrupt or truncated (SafetensorError: ",
    ),
    Case(
        "model-garbage-pytorch-bin",
        model_args(garbage_bin),
        "weights file {tmp}/broken-model/pytorch_model.bin is corrupt or truncated (neither a zip archive nor a pickle); "
        "save the model again with save_pretrained()",
    ),
    Case("model-bad-config-json", model_args(bad_config), "{tmp}/broken-model/config.json cannot be read as JSON (JSONDecodeError: "),
    Case(
        "model-unknown-name-offline",
        lambda env: ingest_args(
            env, "--corpus", str(FIXTURE_DATA.parent / "mrpc_dev_head.tsv"), "--format", "pairs-tsv", model="no-such-org/no-such-model"
        ),
        "cannot load model 'no-such-org/no-such-model': it is not a local directory, a packaged model (all-MiniLM-L6-v2) "
        "or in the Hugging Face cache, and the hub is offline (HF_HUB_OFFLINE=1)",
    ),
    # query parameters from the command line
    # ingest options and run names: refused before anything is stored, the name stays usable
    Case(
        "chunk-cells-zero",
        corpus_args("ok.txt", "a cat sat\n", "text", "--chunk-cells", "0", "--name", "r"),
        "--chunk-cells must be a positive number of cells, not 0",
        then=corpus_args("ok.txt", "a cat sat\n", "text", "--name", "r"),
    ),
    Case(
        "chunk-cells-negative",
        corpus_args("ok.txt", "a cat sat\n", "text", "--chunk-cells", "-5", "--name", "r"),
        "--chunk-cells must be a positive number of cells, not -5",
        then=corpus_args("ok.txt", "a cat sat\n", "text", "--name", "r"),
    ),
    Case(
        "run-name-300-characters",
        corpus_args("ok.txt", "a cat sat\n", "text", "--name", "x" * 300),
        "is not usable: give --name with 1 to 200 printable characters",
    ),
    Case("run-name-control-character", corpus_args("ok.txt", "a cat sat\n", "text", "--name", "a\tb"), "run name 'a\\tb' is not usable"),
    # databases that are not (this version's) attnstore stores
    Case(
        "db-not-a-sqlite-file",
        lambda env: ["runs", *not_a_database(env)],
        "not-a-db.txt: file is not a database; is it an attnstore SQLite store (meta.sqlite)?",
        store_args=False,
    ),
    Case(
        "db-mysql-url",
        lambda env: ["runs", "--db", "mysql://root@127.0.0.1/test"],
        "cannot use database URL 'mysql://root@127.0.0.1/test': attnstore keeps metadata in SQLite or PostgreSQL",
        store_args=False,
    ),
    Case("db-newer-revision-upgrade", newer_schema("db", "upgrade"), "is at revision 9999, newer than this attnstore (head "),
    Case("db-newer-revision-current", newer_schema("db", "current"), "is at revision 9999, newer than this attnstore (head "),
    Case("db-newer-revision-runs", newer_schema("runs"), "upgrade attnstore (pip install -U attnstore) to use it"),
    # query parameters from the command line
    Case(
        "param-int-given-text",
        query_args("word_maps", "layer=abc"),
        "parameter layer of query 'word_maps' must be an integer, not 'abc'; e.g. --param layer=0",
    ),
    Case(
        "param-int-given-float",
        query_args("dependency", "min_count=1.5"),
        "parameter min_count of query 'dependency' must be an integer, not '1.5'; e.g. --param min_count=100",
    ),
    Case(
        "param-empty",
        query_args("dependency_summary", "min_count="),
        "parameter min_count of query 'dependency_summary' needs a value, not '': give --param min_count=VALUE or leave it out for the default 100",
    ),
    Case("param-empty-text", query_args("special_tokens", "punct="), "parameter punct of query 'special_tokens' needs a value"),
    Case(
        "param-bool-maybe",
        query_args("test_flags", "smooth=maybe", register=flags_query),
        "parameter smooth of query 'test_flags' must be true or false, not 'maybe'; e.g. --param smooth=false",
    ),
    Case(
        "param-optional-int",
        query_args("test_flags", "top=ten", register=flags_query),
        "parameter top of query 'test_flags' must be an integer (or none), not 'ten'",
    ),
    Case(
        "param-optional-float-text-annotation",
        query_args("test_flags", "scale=inf", register=flags_query),
        "parameter scale of query 'test_flags' must be a number (or none), not 'inf'",
    ),
    Case("param-examples-backwards", query_args("entropy", "examples=5-2"), "examples='5-2': range '5-2' ends before it starts"),
    Case("param-examples-negative", query_args("entropy", "examples=-1"), "examples='-1': positions start at 0"),
    # fine-tuning and evaluation
    Case(
        "finetune-zero-epochs",
        lambda env: ["finetune", "--task", "SST-2", "--model", env.model, "--epochs", "0", "--no-progress"],
        "--epochs, --batch-size, --lr and --train-limit must be positive",
    ),
    Case(
        "finetune-task-without-train-split",
        lambda env: ["finetune", "--task", "QNLI", "--model", env.model, "--no-progress"],
        "QNLI has no train split in the data directory",
    ),
    Case(
        "evaluate-unknown-model",
        lambda env: ["evaluate", "--task", "MRPC", "--model", "no-such-org/no-such-model", "--no-progress"],
        "cannot load model 'no-such-org/no-such-model'",
    ),
    Case(
        "save-a-query-that-is-not-per-head",
        lambda env: [*query_args("dependency_summary")(env), "--save"],
        "query 'dependency_summary' is not per head (one row per layer and head), so it cannot be saved to head_metrics",
    ),
    Case(
        "param-head-negative",
        query_args("word_maps", "head=-1"),
        "parameter head of query 'word_maps' must be 0 or more (heads are numbered from 0), not '-1'",
    ),
    Case(
        "param-layer-negative",
        query_args("cls_feature_attention", "layer=-1"),
        "parameter layer of query 'cls_feature_attention' must be 0 or more",
    ),
    Case(
        "view-head-negative",
        lambda env: ["view", "--run", "r", "--example", "0", "--layer", "0", "--head", "-1", "--out", str(env.tmp / "v.png")],
        "--head -1: heads are numbered from 0",
    ),
    Case("param-unknown", query_args("entropy", "layer=1"), "query 'entropy' has no parameter 'layer'; it takes: average, examples"),
]


# ---------------------------------------------------------------- the driver


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """A random 2-layer, 2-head BERT (hidden 16) with a 40-word WordPiece vocabulary, saved like a real model."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import torch

    folder = tmp_path_factory.mktemp("tiny-bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz.,'", "the", "cat", "sat", "go", "do", "##t"]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, max_position_embeddings=64
    )
    transformers.BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture
def env(tmp_path, tiny_model, monkeypatch, migrated_sqlite) -> Env:
    """A store as `db upgrade` leaves it (a migrated SQLite file, an empty array root): the file copied from the
    session's migrated one (conftest.py), which costs a millisecond where `db upgrade` cost 0.1-0.2 s a case."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    shutil.copyfile(migrated_sqlite, tmp_path / "meta.sqlite")
    (tmp_path / "attention.zarr").mkdir()
    return Env(tmp_path, tiny_model, monkeypatch)


def row_counts(env: Env) -> dict[str, int]:
    engine = sa.create_engine(f"sqlite:///{env.tmp / 'meta.sqlite'}")
    with engine.connect() as conn:
        counts = {t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one() for t in COUNTED_TABLES}
    engine.dispose()
    return counts


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input_gives_one_line_and_writes_nothing(case: Case, env: Env):
    args = case.build(env)
    before = row_counts(env)
    result = CliRunner().invoke(main, [*args, *(env.store_args if case.store_args else [])])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert case.expect.format(tmp=env.tmp) in lines[0], lines[0]
    if case.store_unchanged:
        assert row_counts(env) == before
        runs_folder = env.tmp / "attention.zarr" / "runs"
        assert not runs_folder.exists() or not any(runs_folder.iterdir()), "an array folder was left behind"
    if case.then is not None:
        again = CliRunner().invoke(main, [*case.then(env), *env.store_args])
        assert again.exit_code == 0, again.output


def test_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


def test_the_same_inputs_made_good_do_ingest(env: Env):
    """Control: the tiny model and a CoNLL-U file with a multiword token and an empty node ingest cleanly, so the
    failures above come from the bad input alone."""
    args = corpus_args("good.conllu", GOOD_SENTENCE + word(1, 0) + word(2, 1), "conllu")(env)
    result = CliRunner().invoke(main, [*args, "--name", "good", *env.store_args])
    assert result.exit_code == 0, result.output
    assert row_counts(env) == {"datasets": 1, "examples": 2, "models": 1, "runs": 1}
