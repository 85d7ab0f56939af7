"""Streaming, validating readers for corpus files: text, pairs-tsv and CoNLL-U.

Each reader yields `ExampleInput` records in file order and raises `CorpusError`
naming the file and line on the first malformed record. Ingestion reads a file
twice: once to validate it whole (nothing is written if it is bad), once to store.
"""

from __future__ import annotations

import csv
import hashlib
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from ..store.records import ExampleInput
from .errors import CorpusError, EmptyCorpusError

# Column names of known pair corpora (GLUE and HF exports): first match wins.
PAIR_COLUMNS = [
    ("text_a", "text_b"),
    ("sentence1", "sentence2"),
    ("#1 String", "#2 String"),
    ("question", "sentence"),
    ("premise", "hypothesis"),
    ("question1", "question2"),
]
LABEL_COLUMNS = ("label", "Quality", "gold_label", "score")
SINGLE_COLUMNS = ("sentence", "text")


def file_checksum(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, line without newline), decoding UTF-8 strictly, dropping a BOM."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(path, None, "no such file", "check the --corpus path")
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if number == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff")):
                raise CorpusError(
                    path,
                    1,
                    "the file is UTF-16 (it starts with a UTF-16 byte-order mark), not UTF-8",
                    "re-encode it as UTF-8, e.g. iconv -f utf-16 -t utf-8",
                )
            if b"\x00" in raw:
                raise CorpusError(path, number, _nul_problem(raw), _nul_fix(raw))
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorpusError(
                    path,
                    number,
                    f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})",
                    "re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8",
                ) from None
            if number == 1:
                line = line.lstrip("\ufeff")
            yield number, line.rstrip("\r\n")


def _nul_problem(raw: bytes) -> str:
    column = raw.index(b"\x00") + 1
    return f"NUL byte (\\x00) at column {column}"


def _nul_fix(raw: bytes) -> str:
    if raw.count(b"\x00") * 3 >= len(raw.rstrip(b"\r\n")):  # every other byte: UTF-16 without a byte-order mark
        return "the file looks like UTF-16: re-encode it as UTF-8, e.g. iconv -f utf-16le -t utf-8"
    return r"remove the NUL byte (e.g. tr -d '\000' < IN > OUT); PostgreSQL cannot store NUL in text"


def check_no_nul(path, line: int | None, value, what: str = "a field") -> None:
    """Raise CorpusError if a decoded string (or any string inside lists/dicts) holds U+0000, e.g. from a JSON \\u0000."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise CorpusError(
                    path,
                    line,
                    f"NUL character (U+0000) in {what}",
                    "remove it (e.g. a \\u0000 escape); PostgreSQL cannot store NUL in text",
                )
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def read_text(path) -> Iterator[ExampleInput]:
    """One example per non-blank line."""
    position = 0
    for number, line in read_lines(path):
        if line.strip():
            yield ExampleInput(position=position, text_a=line.strip(), source_line=number)
            position += 1


def read_jsonl(path, text_a: str | None = None, label: str | None = None) -> Iterator[ExampleInput]:
    """One example per line, a JSON object whose `text_a` field (default "text") holds a whole text, however long (a
    document: ingest keeps it whole up to the model's limit); "id" becomes the example's doc_id, `label` its label."""
    import json

    field_name = text_a or "text"
    position = 0
    for number, line in read_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpusError(
                path, number, f"not a JSON object ({exc.msg} at column {exc.colno})", "write one JSON object per line"
            ) from None
        if not isinstance(record, dict) or not isinstance(record.get(field_name), str):
            raise CorpusError(
                path,
                number,
                f"no string field {field_name!r}",
                f"give each line a {field_name!r} text (or name its field with --text-a-column)",
            )
        check_no_nul(path, number, record[field_name], f"field {field_name!r}")
        doc_id = record.get("id")
        value = record.get(label) if label else None
        yield ExampleInput(
            position=position,
            text_a=record[field_name],
            label=None if value is None else str(value),
            doc_id=None if doc_id is None else str(doc_id),
            source_line=number,
        )
        position += 1


def _pick(header: list[str], wanted, path, option: str) -> int:
    if wanted not in header:
        raise CorpusError(path, 1, f"no column {wanted!r} in header {header}", f"pass an existing column name to {option}")
    return header.index(wanted)


def read_pairs_tsv(
    path,
    text_a: str | None = None,
    text_b: str | None = None,
    label: str | None = None,
    quoting: str = "none",
    index: str | None = None,
    label_map: dict | None = None,
) -> Iterator[ExampleInput]:
    """A tab-separated file with a header; two text columns become two segments.

    Columns are found by name (GLUE's `#1 String`/`#2 String`, `sentence1`/`sentence2`,
    `question`/`sentence`, ...) unless given. `quoting="none"` is GLUE's convention
    (quotes are text); `quoting="csv"` reads "..." fields with "" escapes (HF exports).
    """
    return read_tsv(path, text_a=text_a, text_b=text_b, label=label, quoting=quoting, index=index, label_map=label_map, pairs=True)


def read_tsv(
    path,
    text_a: str | None = None,
    text_b: str | None = None,
    label: str | None = None,
    quoting: str = "none",
    index: str | None = None,
    label_map: dict | None = None,
    pairs: bool = False,
) -> Iterator[ExampleInput]:
    """A TSV file with a header: one text column (`pairs=False`, e.g. SST-2) or two.

    `index` names a column holding the row's own index in the original corpus;
    `label_map` turns stored label codes into names (e.g. RTE's HF export: 0 -> entailment).
    """
    lines = read_lines(path)
    try:
        header_line, header_text = next(lines)
    except StopIteration:
        raise EmptyCorpusError(path) from None
    header = header_text.split("\t")
    if pairs and (text_a is None or text_b is None):
        found = next(((a, b) for a, b in PAIR_COLUMNS if a in header and b in header), None)
        if found is None:
            raise CorpusError(
                path, header_line, f"cannot tell the two text columns from header {header}", "pass --text-a-column and --text-b-column"
            )
        text_a, text_b = text_a or found[0], text_b or found[1]
    if not pairs and text_a is None:
        text_a = next((c for c in SINGLE_COLUMNS if c in header), None)
        if text_a is None:
            raise CorpusError(path, header_line, f"cannot tell the text column from header {header}", "pass --text-a-column")
    ia = _pick(header, text_a, path, "--text-a-column")
    ib = _pick(header, text_b, path, "--text-b-column") if pairs else None
    if label is None:
        label = next((c for c in LABEL_COLUMNS if c in header), None)
    il = _pick(header, label, path, "--label-column") if label else None
    ii = _pick(header, index, path, "index column") if index else None
    position = 0
    for number, fields in _split_rows(path, lines, quoting):
        if len(fields) == 1 and not fields[0].strip():
            continue
        if len(fields) != len(header):
            raise CorpusError(
                path,
                number,
                f"expected {len(header)} tab-separated fields, found {len(fields)}",
                "fix the row (a stray tab or quote?) or use the right --format",
            )
        a = fields[ia].strip()
        b = fields[ib].strip() if ib is not None else None
        if not a or (ib is not None and not b):
            raise CorpusError(path, number, f"empty text in column {text_a if not a else text_b!r}", "fill in or remove the row")
        value = fields[il] if il is not None else None
        if label_map is not None and value is not None:
            if value not in label_map:
                raise CorpusError(path, number, f"unknown label {value!r}", f"labels must be one of {sorted(label_map)}")
            value = label_map[value]
        source_index = None
        if ii is not None:
            try:
                source_index = int(fields[ii])
            except ValueError:
                raise CorpusError(path, number, f"index {fields[ii]!r} is not an integer", "fix the index column") from None
        yield ExampleInput(position=position, text_a=a, text_b=b, label=value, source_line=number, source_index=source_index)
        position += 1


def _split_rows(path, lines, quoting: str):
    if quoting == "none":
        for number, line in lines:
            yield number, line.split("\t")
        return
    if quoting != "csv":
        raise CorpusError(path, None, f"unknown quoting {quoting!r}", "use none or csv")
    # The header (line 1) was consumed already: file line = line_num + 1 (a quoted field may span lines).
    reader = csv.reader((line for _, line in lines), delimiter="\t", strict=True)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise CorpusError(path, reader.line_num + 1, f"bad CSV quoting ({exc})", "fix the quotes or use --quoting none") from None
        yield reader.line_num + 1, row


_ID_WORD = re.compile(r"^[1-9][0-9]*$")
_ID_RANGE = re.compile(r"^([1-9][0-9]*)-([1-9][0-9]*)$")
_ID_EMPTY = re.compile(r"^[0-9]+\.[1-9][0-9]*$")


def read_conllu(path) -> Iterator[ExampleInput]:
    """CoNLL-U sentences with gold annotation (10 columns; ranges and empty nodes skipped)."""
    position = 0
    sentence: list[tuple[int, list[str]]] = []
    comments: dict[str, str] = {}
    doc_id = None
    start_line = None
    for number, line in read_lines(path):
        if not line.strip():
            if sentence:
                yield _conllu_sentence(path, position, sentence, comments, doc_id, start_line)
                position += 1
            elif comments:
                raise CorpusError(path, number, "sentence has comments but no words", "remove the stray comment lines")
            sentence, comments, start_line = [], {}, None
            continue
        start_line = start_line or number
        if line.startswith("#"):
            key, _, value = line[1:].partition("=")
            key = key.strip()
            if key in ("newdoc id", "newdoc"):
                doc_id = value.strip() or None
            comments[key] = value.strip()
            continue
        fields = line.split("\t")
        if len(fields) != 10:
            raise CorpusError(
                path,
                number,
                f"expected 10 tab-separated CoNLL-U columns, found {len(fields)}",
                "check the line (spaces instead of tabs?) or use --format text",
            )
        sentence.append((number, fields))
    if sentence:
        yield _conllu_sentence(path, position, sentence, comments, doc_id, start_line)


def _conllu_sentence(path, position, lines, comments, doc_id, start_line) -> ExampleInput:
    words: list[dict] = []
    ranges: dict[int, tuple[int, int, str, bool]] = {}  # first word id -> (first, last, surface form, space after)
    raw_heads: list[str] = []  # each word's HEAD column as written ("_", "0", "3", ...)
    for number, f in lines:
        wid = f[0]
        m = _ID_RANGE.match(wid)
        if m:
            first, last = int(m.group(1)), int(m.group(2))
            if last < first:
                raise CorpusError(path, number, f"bad multiword range {wid!r}", "ranges are FIRST-LAST with FIRST <= LAST")
            ranges[first] = (first, last, f[1], "SpaceAfter=No" not in f[9])
            continue
        if _ID_EMPTY.match(wid):
            continue  # empty nodes are not surface words
        if not _ID_WORD.match(wid):
            raise CorpusError(path, number, f"bad word ID {wid!r}", "IDs are 1, 2, ... (ranges 1-2, empty nodes 1.1)")
        if int(wid) != len(words) + 1:
            raise CorpusError(path, number, f"word ID {wid} out of sequence (expected {len(words) + 1})", "renumber the sentence")
        head = f[6]
        if head != "_" and not (head.isascii() and head.isdigit()):
            raise CorpusError(path, number, f"HEAD {head!r} is not a number", "HEAD must be 0 (root) or a word ID")
        raw_heads.append(head)
        words.append(
            dict(
                position=len(words),
                segment=0,
                sentence=0,
                form=f[1],
                lemma=_opt(f[2]),
                upos=_opt(f[3]),
                xpos=_opt(f[4]),
                feats=_opt(f[5]),
                head=None if head == "_" or int(head) == 0 else int(head) - 1,
                deprel=_opt(f[7]),
                misc=_opt(f[9]),
                line=number,
                _space=("SpaceAfter=No" not in f[9]),
            )
        )
    for w in words:
        if w["head"] is not None and w["head"] >= len(words):
            raise CorpusError(
                path,
                w["line"],
                f"HEAD {w['head'] + 1} points past the sentence's {len(words)} words",
                f"HEAD must be 0 (root) or the ID of a word of the same sentence (1-{len(words)})",
            )
    _check_tree(path, start_line, words, raw_heads, comments.get("sent_id"))
    text = _attach_char_spans(words, ranges)
    return ExampleInput(
        position=position,
        text_a=comments.get("text") or text,
        doc_id=doc_id,
        sent_id=comments.get("sent_id"),
        source_line=start_line,
        words=tuple(words),
    )


def _check_tree(path, start_line, words: list[dict], raw_heads: list[str], sent_id: str | None) -> None:
    """A sentence whose words have HEADs must form one tree: exactly one word with HEAD 0, no cycles.

    Sentences with no HEADs at all (every HEAD `_`) carry no tree and pass. A sentence that
    leaves some HEADs `_` is only checked for cycles (its root may be among the unannotated words).
    Errors name the sentence's first line (its first comment or word line).
    """
    if all(h == "_" for h in raw_heads):
        return
    which = f"sentence {sent_id!r}" if sent_id else "the sentence"
    if "_" not in raw_heads:
        roots = [w for w, h in zip(words, raw_heads) if int(h) == 0]
        if not roots:
            raise CorpusError(path, start_line, f"{which} has no root (no word with HEAD 0)", "give its main word HEAD 0 and deprel root")
        if len(roots) > 1:
            listed = ", ".join(f"{r['position'] + 1} (line {r['line']})" for r in roots)
            raise CorpusError(
                path,
                start_line,
                f"{which} has {len(roots)} roots: words {listed} have HEAD 0",
                "give exactly one word HEAD 0 and attach the others to words of the sentence",
            )
    state = [0] * len(words)  # 0 unvisited, 1 on the current path, 2 known to reach the root
    for start in range(len(words)):
        path_ids = []
        node = start
        while node is not None and state[node] == 0:
            state[node] = 1
            path_ids.append(node)
            node = words[node]["head"]
        if node is not None and state[node] == 1:
            cycle = path_ids[path_ids.index(node) :]
            listed = " -> ".join(str(i + 1) for i in cycle + [node])
            raise CorpusError(
                path,
                start_line,
                f"dependency cycle in {which}: words {listed} (word {node + 1} is on line {words[node]['line']})",
                "fix the HEAD column so every word leads to the root (HEAD 0)",
            )
        for i in path_ids:
            state[i] = 2


def _attach_char_spans(words: list[dict], ranges) -> str:
    """Give each syntactic word character offsets in the reconstructed sentence text.

    Words of a multiword token share the surface token's span when their forms do not
    spell it (e.g. a contraction); otherwise each gets its own part of it.
    """
    parts: list[str] = []
    cursor = 0
    i = 0
    while i < len(words):
        first = i + 1
        if first in ranges:
            _, last, surface, space = ranges[first]
            group = words[i:last]
            if "".join(w["form"] for w in group) == surface:
                start = cursor
                for w in group:
                    w["char_start"], w["char_end"] = start, start + len(w["form"])
                    start += len(w["form"])
            else:
                for w in group:
                    w["char_start"], w["char_end"] = cursor, cursor + len(surface)
            parts.append(surface + (" " if space else ""))
            cursor += len(surface) + (1 if space else 0)
            i = last
            continue
        w = words[i]
        w["char_start"], w["char_end"] = cursor, cursor + len(w["form"])
        parts.append(w["form"] + (" " if w["_space"] else ""))
        cursor += len(w["form"]) + (1 if w["_space"] else 0)
        i += 1
    for w in words:
        w.pop("_space", None)
    return "".join(parts).rstrip()


def _opt(value: str) -> str | None:
    return None if value == "_" else value


# The reader of each --format (FORMATS, in this order, are the command line's choices). A reader's parameters after
# the path are its reading options, which decide its examples (ingest/runner.py `reading_options`); text and
# CoNLL-U take none, and read_corpus gives them none whatever it is given.
FORMAT_READERS: dict[str, Callable[..., Iterator[ExampleInput]]] = {
    "text": read_text,
    "tsv": read_tsv,
    "pairs-tsv": read_pairs_tsv,
    "conllu": read_conllu,
    "jsonl": read_jsonl,
}
FORMATS = tuple(FORMAT_READERS)


def read_corpus(path, fmt: str, **options) -> Iterator[ExampleInput]:
    """The examples of a corpus file in format `fmt`, read by FORMAT_READERS[fmt] with the reading options it takes."""
    reader = FORMAT_READERS.get(fmt)
    if reader is None:
        raise CorpusError(path, None, f"unknown format {fmt!r}", f"use one of {', '.join(FORMATS)}")
    takes_options = len(inspect.signature(reader).parameters) > 1
    return reader(path, **options) if takes_options else reader(path)


def validate_corpus(path, fmt: str, limit: int | None = None, **options) -> int:
    """Read the whole file (or its first `limit` examples), raising on the first bad record; return the count."""
    count = 0
    for _ in read_corpus(path, fmt, **options):
        count += 1
        if limit is not None and count >= limit:
            break
    if count == 0:
        raise EmptyCorpusError(path)
    return count
