"""Fixtures of the ingest tests: tiny random decoders saved once per module (tests/ingest/test_decoders.py `build`)."""

import pytest


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache: dict[str, str] = {}

    def get(arch: str) -> str:
        if arch not in cache:
            from attnstore.tests.ingest.test_decoders import build

            cache[arch] = build(arch, tmp_path_factory.mktemp(arch))
        return cache[arch]

    return get
