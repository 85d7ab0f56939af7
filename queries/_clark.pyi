# The compiled Clark reduce (queries/_clark.c); see queries/clark_sums.py. It takes any C-contiguous buffer.
import numpy as np

KERNEL_VERSION: int

def sums(maps: np.ndarray, n_maps: int, length: int, keys: np.ndarray, table: np.ndarray, out: np.ndarray, float16: bool, /) -> None: ...
