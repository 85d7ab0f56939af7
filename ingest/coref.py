"""GUM / OntoGUM coreference (CorefUD `Entity=` brackets in CoNLL-U MISC), windowed for a model.

A document becomes consecutive windows of whole sentences of at most `window_words`
words (a longer sentence is a window of its own), so a mention and its antecedents can
be looked up within a window that fits the model. Each window is one example; its
mentions go to the `mentions` table with their head word taken from the gold tree.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from ..store.records import ExampleInput
from .corpus import read_conllu
from .errors import CorpusError

DEFAULT_WINDOW_WORDS = 128  # ~170 wordpieces with the uncased BERT vocabulary: fits every model here
_BRACKET = re.compile(r"\(([^()]+)\)|\(([^()]+)|([^()]+)\)")


def entity_brackets(misc: str | None) -> list[tuple[str, str]]:
    """[(kind, entity)] from a MISC column, kind in open / close / single, in written order."""
    if not misc:
        return []
    value = next((part[len("Entity=") :] for part in misc.split("|") if part.startswith("Entity=")), None)
    if not value:
        return []
    out = []
    for single, opened, closed in _BRACKET.findall(value):
        if single:
            out.append(("single", single.split("-")[0]))
        elif opened:
            out.append(("open", opened.split("-")[0]))
        else:
            out.append(("close", closed.split("-")[0]))
    return out


def mention_kind(upos: str | None) -> str:
    """Clark et al.'s breakdown: pronoun, proper (name) or nominal, from the head word's UPOS."""
    if upos == "PRON":
        return "pronoun"
    if upos == "PROPN":
        return "proper"
    return "nominal"


def head_of_span(words: list[dict], start: int, end: int) -> int:
    """The span word whose gold head lies outside the span (the first such word)."""
    for w in words[start:end]:
        if w["head"] is None or not start <= w["head"] < end:
            return w["position"]
    return words[start]["position"]


def document_mentions(path, sentences: list[ExampleInput]) -> list[tuple[int, int, int, str]]:
    """All mentions of a document as (sentence index, start word, end word exclusive, entity)."""
    mentions = []
    open_spans: dict[str, list[tuple[int, int, int]]] = {}
    for s_idx, sent in enumerate(sentences):
        for w in sent.words:
            for kind, entity in entity_brackets(w.get("misc")):
                if kind == "single":
                    mentions.append((s_idx, w["position"], w["position"] + 1, entity))
                elif kind == "open":
                    open_spans.setdefault(entity, []).append((s_idx, w["position"], w["line"]))
                else:
                    if not open_spans.get(entity):
                        raise CorpusError(path, w["line"], f"entity {entity!r} closes without being opened", "balance the Entity= brackets")
                    o_sent, o_start, o_line = open_spans[entity].pop()
                    if o_sent != s_idx:
                        raise CorpusError(path, o_line, f"mention of entity {entity!r} spans sentences", "close it in its sentence")
                    mentions.append((s_idx, o_start, w["position"] + 1, entity))
    unclosed = [(line, e) for e, spans in open_spans.items() for _, _, line in spans]
    if unclosed:
        line, entity = min(unclosed)
        raise CorpusError(path, line, f"entity {entity!r} is opened but never closed", "balance the Entity= brackets")
    return sorted(mentions, key=lambda m: (m[0], m[1], -m[2]))


def read_gum_documents(directory, window_words: int = DEFAULT_WINDOW_WORDS) -> Iterator[ExampleInput]:
    """Windows of the documents of a folder of CoNLL-U files (sorted by name), with mentions."""
    directory = Path(directory)
    files = sorted(directory.glob("*.conllu"))
    if not files:
        raise CorpusError(directory, None, "no .conllu files in this folder", "point --data-dir at the corpus")
    position = 0
    for path in files:
        sentences = list(read_conllu(path))
        mentions = document_mentions(path, sentences)
        order = {m: i for i, m in enumerate(mentions)}
        for window in _windows(sentences, window_words):
            yield _window_example(position, path.stem, sentences, window, mentions, order)
            position += 1


def _windows(sentences: list[ExampleInput], window_words: int) -> Iterator[list[int]]:
    window: list[int] = []
    size = 0
    for i, sent in enumerate(sentences):
        n = len(sent.words)
        if window and window_words and size + n > window_words:  # 0: the whole document, one window
            yield window
            window, size = [], 0
        window.append(i)
        size += n
    if window:
        yield window


def _window_example(position, doc_id, sentences, window, mentions, order) -> ExampleInput:
    words: list[dict] = []
    offsets: dict[int, int] = {}
    texts: list[str] = []
    chars = 0
    for k, s_idx in enumerate(window):
        sent = sentences[s_idx]
        base = len(words)
        offsets[s_idx] = base
        for w in sent.words:
            words.append(
                {
                    **w,
                    "position": base + w["position"],
                    "sentence": k,
                    "head": None if w["head"] is None else base + w["head"],
                    "char_start": chars + w["char_start"],
                    "char_end": chars + w["char_end"],
                }
            )
        texts.append(sent.text_a)
        chars += len(sent.text_a) + 1
    window_mentions = []
    for m in mentions:
        s_idx, start, end, entity = m
        if s_idx not in offsets:
            continue
        base = offsets[s_idx]
        head = head_of_span(words, base + start, base + end)
        window_mentions.append(
            dict(
                word_start=base + start,
                word_end=base + end,
                head=head,
                entity=entity,
                kind=mention_kind(words[head]["upos"]),
                doc_order=order[m],
            )
        )
    first = sentences[window[0]]
    return ExampleInput(
        position=position,
        text_a=" ".join(texts),
        doc_id=doc_id,
        sent_id=first.sent_id,
        source_line=first.source_line,
        words=tuple(words),
        mentions=tuple(window_mentions),
    )
