"""Progress bars of ingest's long steps (annotation, forward passes, fine-tuning), shown on stderr when asked for."""

from __future__ import annotations


def progress_bar(total: int, desc: str, enabled: bool, unit: str = "ex"):
    """A tqdm bar (imported when first used), hidden unless `enabled`."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=True, leave=False)
