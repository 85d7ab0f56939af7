"""FrameNet 1.5 exemplars: frames, targets (lexical units) and frame elements over words.

Two layouts are read: the derived JSON Lines of ../shared/data/framenet_v15/derived
(`lu_exemplars_max12tok.jsonl` + `frames.jsonl`) and the official release's XML
(`lu/*.xml` with `frame/*.xml`). An example is one annotation set of an exemplar sentence;
its words are FrameNet's whitespace tokens (tagged by spaCy later), and character spans
are mapped to word spans [start, end).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

from ..store.records import ExampleInput
from .corpus import check_no_nul, read_lines
from .errors import CorpusError

FN_NS = "{http://framenet.icsi.berkeley.edu}"


def whitespace_words(text: str) -> list[dict]:
    words: list[dict] = []
    cursor = 0
    for form in text.split():
        start = text.index(form, cursor)
        cursor = start + len(form)
        words.append(dict(position=len(words), segment=0, sentence=0, form=form, char_start=start, char_end=cursor))
    return words


def char_span_to_words(words: list[dict], start: int, end: int) -> tuple[int | None, int | None]:
    """Words overlapping characters [start, end): (first, last + 1), or (None, None) if none do."""
    hit = [w["position"] for w in words if w["char_start"] < end and w["char_end"] > start]
    return (hit[0], hit[-1] + 1) if hit else (None, None)


def load_core_sets(frames_path) -> dict[int, set[str]]:
    """frame id -> names of the FEs in the frame's FEcoreSets (NLTK's definition of core FEs)."""
    core: dict[int, set[str]] = {}
    for number, line in read_lines(frames_path):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            core[int(rec["frame_id"])] = {name for group in rec.get("FEcoreSets", []) for name in group}
        except (ValueError, KeyError, TypeError) as exc:
            raise CorpusError(frames_path, number, f"not a frame record ({exc})", "check the frames JSON Lines file") from None
    return core


def _example(position, text, words, source_line, sent_id, frame_fields, target, elements, core_set) -> ExampleInput:
    t_start, t_end = char_span_to_words(words, *target)
    fes = []
    for start, end, name, core_type in elements:
        w_start, w_end = char_span_to_words(words, start, end)
        fes.append(
            dict(
                name=name,
                core_type=core_type,
                in_core_set=name in core_set,
                char_start=start,
                char_end=end,
                word_start=w_start,
                word_end=w_end,
            )
        )
    frame = dict(frame_fields, target_start=t_start, target_end=t_end, char_start=target[0], char_end=target[1], elements=fes)
    return ExampleInput(
        position=position,
        text_a=text.rstrip(),
        sent_id=sent_id,
        source_line=source_line,
        words=tuple(words),
        frames=(frame,),
        pretokenized=True,
    )


def read_exemplars_jsonl(path, frames_path=None) -> Iterator[ExampleInput]:
    """Derived exemplars: one annotation set per line (first target span; FE spans end-exclusive)."""
    path = Path(path)
    core = load_core_sets(frames_path or path.with_name("frames.jsonl"))
    position = 0
    for number, line in read_lines(path):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            text = rec["text"]
            target = tuple(rec["target"][0])
            fields = dict(
                annoset_id=int(rec["annoset_id"]),
                frame_id=int(rec["frame_id"]),
                frame=rec["frame_name"],
                lu_id=int(rec["lu_id"]),
                lu=rec["lu_name"],
            )
            # coreType null (2 records of the 1.5 exemplars: an FE the frame does not define) -> "" (unknown)
            elements = [(int(s), int(e), name, ctype or "") for s, e, name, ctype in rec["fe"]]
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise CorpusError(
                path,
                number,
                f"not an exemplar record ({type(exc).__name__}: {exc})",
                "each line needs text, target, fe, frame_id, frame_name, lu_id, lu_name, annoset_id",
            ) from None
        check_no_nul(path, number, rec, "the record")
        if not 0 <= target[0] < target[1] <= len(text) or any(not 0 <= s < e <= len(text) for s, e, _, _ in elements):
            raise CorpusError(path, number, "a character span lies outside the text", "spans are [start, end) offsets into text")
        yield _example(
            position,
            text,
            whitespace_words(text),
            number,
            str(rec.get("sent_id")),
            fields,
            target,
            elements,
            core.get(fields["frame_id"], set()),
        )
        position += 1


def read_release_xml(root) -> Iterator[ExampleInput]:
    """The official FrameNet XML layout: lu/*.xml exemplars, core sets from frame/*.xml (ends inclusive)."""
    root = Path(root)
    lu_files = sorted((root / "lu").glob("*.xml"))
    if not lu_files:
        raise CorpusError(root, None, "no lu/*.xml files", "point at the FrameNet release folder (with lu/ and frame/)")
    core: dict[int, set[str]] = {}
    core_types: dict[tuple[int, str], str] = {}
    for frame_file in sorted((root / "frame").glob("*.xml")):
        frame = _parse(frame_file)
        frame_id = int(frame.get("ID"))
        core[frame_id] = {m.get("name") for cs in frame.iter(f"{FN_NS}FEcoreSet") for m in cs.iter(f"{FN_NS}memberFE")}
        for fe in frame.iter(f"{FN_NS}FE"):
            core_types[(frame_id, fe.get("name"))] = fe.get("coreType", "")
    position = 0
    for lu_file in lu_files:
        lu = _parse(lu_file)
        fields = dict(frame_id=int(lu.get("frameID")), frame=lu.get("frame"), lu_id=int(lu.get("ID")), lu=lu.get("name"))
        for sentence in lu.iter(f"{FN_NS}sentence"):
            text = sentence.findtext(f"{FN_NS}text") or ""
            for annoset in sentence.iter(f"{FN_NS}annotationSet"):
                layers = {layer.get("name"): layer for layer in annoset.iter(f"{FN_NS}layer") if layer.get("rank", "1") == "1"}
                targets = [(int(lab.get("start")), int(lab.get("end")) + 1) for lab in layers.get("Target", []) if lab.get("start")]
                if not targets:
                    continue
                elements = [
                    (
                        int(lab.get("start")),
                        int(lab.get("end")) + 1,
                        lab.get("name"),
                        core_types.get((fields["frame_id"], lab.get("name")), ""),
                    )
                    for lab in layers.get("FE", [])
                    if lab.get("start")
                ]
                yield _example(
                    position,
                    text,
                    whitespace_words(text),
                    None,
                    sentence.get("ID"),
                    dict(fields, annoset_id=int(annoset.get("ID"))),
                    targets[0],
                    elements,
                    core.get(fields["frame_id"], set()),
                )
                position += 1


def _parse(path):
    try:
        return ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise CorpusError(path, exc.position[0], f"malformed XML ({exc})", "use the release's original files") from None
