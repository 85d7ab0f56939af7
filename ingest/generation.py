"""Ingest of a generation: each example's text is a prompt, the model continues it greedily, and the prompt and what it
generated are stored as one sequence (`attnstore ingest --generate N`).

A causal model's maps over the whole sequence are exactly the attention it paid while generating (each row sees only
the tokens before it), so one forward pass over prompt + generation stores what retrieval-head detection reads at
each decoding step (queries/retrieval_heads.py; Wu et al. 2024, nightdessert/Retrieval_Head: up to 50 tokens, greedy,
stopping after a newline). Generated tokens are segment 1 and belong to no word; the run's manifest records how they
were made.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .align import Encoded
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .model import LoadedModel

GENERATED_SEGMENT = 1


def generation_manifest(max_new_tokens: int) -> dict:
    return {
        "max_new_tokens": max_new_tokens,
        "decoding": "greedy (argmax), with the model's KV cache",
        "stop": "after a token whose text holds a newline, or the end-of-sequence token, or at the run's --max-length",
        "segment": GENERATED_SEGMENT,
    }


def check_generation(loaded: LoadedModel, max_new_tokens: int) -> None:
    """One line, before anything is stored, for a model that cannot generate."""
    if max_new_tokens and (not loaded.causal or loaded.lm is None):
        raise InvalidArgumentError(
            f"--generate needs a causal LM with its LM head; model {loaded.name!r} is "
            f"{'not causal' if not loaded.causal else 'a decoder without its LM head'}"
        )


def with_generation(loaded: LoadedModel, enc: Encoded, max_new_tokens: int, max_length: int) -> Encoded:
    """`enc` with the tokens the model generates after it (greedy, up to `max_new_tokens`, within `max_length`)."""
    import torch

    room = min(max_new_tokens, max_length - enc.length)
    if not enc.input_ids or room <= 0:
        return enc
    tokenizer, lm = loaded.tokenizer, loaded.lm
    eos = tokenizer.eos_token_id
    device = loaded.device
    new: list[int] = []
    with torch.inference_mode():
        step = torch.tensor([enc.input_ids], device=device)
        cache = None
        for _ in range(room):
            out = lm(input_ids=step, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            token = int(out.logits[0, -1].argmax())
            new.append(token)
            if token == eos or "\n" in tokenizer.decode([token]):
                break
            step = torch.tensor([[token]], device=device)
    pieces = tokenizer.convert_ids_to_tokens(new)
    rows = [
        dict(
            token=piece,
            token_id=token,
            word_position=None,
            segment=GENERATED_SEGMENT,
            is_special=token in tokenizer.all_special_ids,
            char_start=None,
            char_end=None,
        )
        for piece, token in zip(pieces, new, strict=True)
    ]
    type_ids = None if enc.token_type_ids is None else [*enc.token_type_ids, *[GENERATED_SEGMENT] * len(new)]
    return replace(enc, input_ids=[*enc.input_ids, *new], token_type_ids=type_ids, tokens=[*enc.tokens, *rows])
