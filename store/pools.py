"""Process-wide thread pools sized by an environment variable (default: the cores this process may use, at most 8),
made on first use and made again in a forked child (the parent's threads do not exist there)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from .errors import InvalidArgumentError


def env_threads(name: str) -> int:
    """A pool's threads from environment variable `name` (a whole number, 1 or more), else the cores this process may
    use (at most 8)."""
    text = os.environ.get(name, "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise InvalidArgumentError(f"{name}={text!r}: give a whole number of threads, 1 or more")
        return int(text)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(8, cores))


class SizedPool:
    """One pool of `env_threads(env)` threads named `prefix`_N, or None for one thread (the caller then works alone)."""

    def __init__(self, env: str, prefix: str):
        self.env, self.prefix = env, prefix
        self._forget()
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self.executor: ThreadPoolExecutor | None = None
        self.workers = 0
        self.lock = threading.Lock()

    def threads(self) -> int:
        return env_threads(self.env)

    def get(self) -> ThreadPoolExecutor | None:
        workers = self.threads()
        if workers < 2:
            return None
        with self.lock:
            if self.executor is None or self.workers != workers:
                self.executor, self.workers = ThreadPoolExecutor(workers, thread_name_prefix=self.prefix), workers
            return self.executor
