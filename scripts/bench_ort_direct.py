#!/usr/bin/env python3
"""The ceiling a server can approach: ONNX Runtime running a model directly
(no server, no network) at fixed batch sizes, single-threaded like one
shardserve instance (intra_op_num_threads=1).

Usage: .venv/bin/python scripts/bench_ort_direct.py [MODEL_DIR=models/mlp_onnx] [SECONDS=3]
Prints, per batch size: executions/s, inferences/s (rows), p50/p99 latency.
"""
import pathlib
import sys
import time

import numpy as np
import onnxruntime as ort


def main():
    model_dir = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "models/mlp_onnx")
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(str(model_dir / "1" / "model.onnx"), opts, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    dims = [d if isinstance(d, int) else 1 for d in inp.shape[1:]]
    print(f"model {model_dir.name}: input {inp.name} {inp.shape}, intra_op_threads=1")
    for batch in (1, 8, 32, 64):
        x = np.random.default_rng(0).standard_normal([batch] + dims).astype(np.float32)
        for _ in range(20):
            sess.run(None, {inp.name: x})
        lat = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            sess.run(None, {inp.name: x})
            lat.append(time.perf_counter() - t0)
        lat = np.array(lat)
        total = lat.sum()
        print(
            f"batch {batch:3d}: {len(lat) / total:9.1f} exec/s  {batch * len(lat) / total:10.1f} infer/s  "
            f"p50 {np.percentile(lat, 50) * 1e6:8.1f} us  p99 {np.percentile(lat, 99) * 1e6:8.1f} us"
        )


if __name__ == "__main__":
    main()
