"""GPU check of the decoder capture: on a CUDA (or MPS) device, the streaming capture's maps against the eager model's,
the Q/K tier's rebuilt maps against them, and the capture's throughput against a bare SDPA forward pass.

    python benchmarks/gpu_check.py [--device cuda] [--length 2048] [--repeats 3]

Prints one line per figure; exits 1 if a map differs from eager by more than 1e-4 (float32) or the device is not there.
Runs on the CPU too (--device cpu), which the test suite covers; this script is for a machine with an accelerator.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch
    import transformers as T

    from attnstore.ingest import streaming
    from attnstore.ingest.model import load_model
    from attnstore.store import qk

    loaded = load_model("SmolLM2-135M-Instruct", device=args.device)
    device = loaded.device
    n, layers, heads = args.length, loaded.n_layers, loaded.n_heads
    ids = torch.randint(100, loaded.tokenizer.vocab_size, (1, n), generator=torch.Generator().manual_seed(0)).to(device)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def timed(run) -> float:
        best = float("inf")
        for _ in range(args.repeats):
            sync()
            t0 = time.perf_counter()
            run()
            sync()
            best = min(best, time.perf_counter() - t0)
        return best

    eager = T.AutoModelForCausalLM.from_pretrained(loaded.source, attn_implementation="eager").eval().get_decoder().to(device)
    sdpa = T.AutoModelForCausalLM.from_pretrained(loaded.source, attn_implementation="sdpa").eval().get_decoder().to(device)
    with torch.inference_mode():
        reference = [a[0].float().cpu().numpy() for a in eager(input_ids=ids, output_attentions=True).attentions]
        del eager
        bare = timed(lambda: sdpa(input_ids=ids))
        dense = streaming.DenseSink(layers, True, torch.float32, stop=False)
        dense_s = timed(lambda: streaming.run_with(streaming.DenseSink(layers, True, torch.float16), lambda: loaded.model(input_ids=ids)))
        streaming.run_with(dense, lambda: loaded.model(input_ids=ids))
        maps = dense.result()[0].numpy()
        dense_err = max(float(np.abs(maps[layer] - reference[layer]).max()) for layer in range(layers))
        sink = streaming.QKSink(layers, torch.float32, loaded.qk["windows"], [n])
        streaming.run_with(sink, lambda: loaded.model(input_ids=ids))
        qk_s = timed(
            lambda: streaming.run_with(
                streaming.QKSink(layers, torch.float16, loaded.qk["windows"], [n]), lambda: loaded.model(input_ids=ids)
            )
        )
    q, k, lse = sink.result()
    entry = qk.qk_entry(
        dtype="float32",
        n_kv_heads=loaded.qk["n_kv_heads"],
        head_dim=loaded.qk["head_dim"],
        scales=sink.scales,
        windows=loaded.qk["windows"],
    )
    qk_err = max(
        float(np.abs(qk.rebuild(q[0], k[0], lse[0], entry, [layer], list(range(heads)))[0] - reference[layer]).max())
        for layer in range(layers)
    )
    print(f"device {device} ({torch.cuda.get_device_name() if device.startswith('cuda') else device}), {n} tokens, best of {args.repeats}")
    print(f"bare SDPA forward: {bare * 1e3:.0f} ms")
    print(f"dense capture (float16 maps to the host): {dense_s * 1e3:.0f} ms = {dense_s / bare:.2f}x; max |d| vs eager {dense_err:.1e}")
    print(f"Q/K capture (float16): {qk_s * 1e3:.0f} ms = {qk_s / bare:.2f}x; float32 Q/K rebuilt vs eager: max |d| {qk_err:.1e}")
    return 0 if max(dense_err, qk_err) <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
