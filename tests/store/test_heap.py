"""store/heap.py: a process set for forward passes puts torch's large CPU tensors on transparent huge pages."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a Python process that runs a forward pass: not in make test-fast

pytest.importorskip("torch")

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# A fresh process (torch reads the setting at its first CPU allocation): set for forward passes, then a 64 MiB tensor
# written once; prints the kB of its memory on huge pages.
PROBE = """
from attnstore.store import heap
heap.for_forward()
import torch
x = torch.ones(16 << 20)
print(sum(int(line.split()[1]) for line in open("/proc/self/smaps") if line.startswith("AnonHugePages")))
"""


def huge_kb(env: dict) -> int:
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


@pytest.mark.skipif(not THP.exists() or "[madvise]" not in THP.read_text(), reason="needs Linux with transparent huge pages on madvise")
def test_forward_passes_get_huge_pages_unless_the_environment_says_no():
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    assert huge_kb(env) >= 2 << 10  # at least one huge page (the kernel may fall back to small pages for some)
    assert huge_kb({**env, "THP_MEM_ALLOC_ENABLE": "0"}) == 0  # the user's setting is kept
