"""A dataset's first load on a thread, so its first run's forward passes start before annotation ends.

The feed annotates and stores the dataset's examples chunk by chunk in corpus order (as
`register_dataset` does); `examples()` yields them in that order as each chunk commits, which is
the order a later run reads them in: the run's batches, and so its maps, are the same. spaCy's
work takes its CPU beside the forward pass instead of before it (docs/PERFORMANCE.md, 2026-11-24 "a forward
pass that stops at the last map; the first ingest's annotation on a thread").
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..store.records import StoredExample
    from .runner import DatasetLoad


class Feed:
    def __init__(self, load: DatasetLoad):
        self.load = load
        self._ready = threading.Condition()
        self._stored = len(load.stored)  # positions 0.._stored-1 are stored (load.stored_a_prefix())
        self._finished = False
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="attnstore-annotate", daemon=True)

    def __enter__(self) -> Feed:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        """Stop after the chunk being stored (the dataset stays incomplete: the next ingest resumes it)."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            for chunk in self.load.chunks():
                if self._stop.is_set():
                    return
                self.load.add(chunk)
                with self._ready:
                    self._stored = chunk[-1].position + 1
                    self._ready.notify_all()
            if not self._stop.is_set():
                self.load.finish()
        except BaseException as exc:  # raised again in the thread reading examples()
            self._error = exc
        finally:
            with self._ready:
                self._finished = True
                self._ready.notify_all()

    def examples(self) -> Iterator[StoredExample]:
        """Every example of the dataset, in corpus order, each as soon as it is stored."""
        read = 0

        def ready() -> bool:
            return self._finished or self._stored > read

        while True:
            with self._ready:
                self._ready.wait_for(ready)
                stored, finished, error = self._stored, self._finished, self._error
            if error is not None:
                raise error
            yield from self.load.store.writer.dataset_examples(self.load.dataset_id, start=read, stop=stored)
            read = stored
            if finished:
                return
