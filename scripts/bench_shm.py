#!/usr/bin/env python3
"""Shared memory vs binary tensor data for one large tensor through
`simple_identity` (BYTES in, same BYTES out): requests per second and MB/s
for each path, with tritonclient, HTTP and gRPC.

usage: bench_shm.py [--http HOST:PORT] [--grpc HOST:PORT] [--mb 4] [--n 50]
"""
import argparse
import os
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import serialize_byte_tensor, serialized_byte_size


def run(label, fn, n, size):
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t0
    print(f"{label:28s} {n / dt:8.1f} req/s  {size * n / dt / 1e6:9.1f} MB/s in  (mean {dt / n * 1e3:.2f} ms)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--http", default="127.0.0.1:8000")
    ap.add_argument("--grpc", default="127.0.0.1:8001")
    ap.add_argument("--mb", type=float, default=4)
    ap.add_argument("--n", type=int, default=50)
    a = ap.parse_args()
    size = int(a.mb * 1024 * 1024)
    data = np.array([[os.urandom(size)]], dtype=np.object_)
    ser = serialize_byte_tensor(data)
    nbytes = serialized_byte_size(ser)
    tag = f"bench_{os.getpid()}"
    h_in = shm.create_shared_memory_region(f"{tag}_in", f"/{tag}_in", nbytes)
    h_out = shm.create_shared_memory_region(f"{tag}_out", f"/{tag}_out", nbytes)
    shm.set_shared_memory_region(h_in, [ser])
    try:
        for proto, module, url in (("http", httpclient, a.http), ("grpc", grpcclient, a.grpc)):
            c = module.InferenceServerClient(url)
            c.unregister_system_shared_memory()
            c.register_system_shared_memory(f"{tag}_in", f"/{tag}_in", nbytes)
            c.register_system_shared_memory(f"{tag}_out", f"/{tag}_out", nbytes)

            def binary():
                i = module.InferInput("INPUT0", [1, 1], "BYTES")
                if proto == "http":
                    i.set_data_from_numpy(data, binary_data=True)
                    o = module.InferRequestedOutput("OUTPUT0", binary_data=True)
                else:
                    i.set_data_from_numpy(data)
                    o = module.InferRequestedOutput("OUTPUT0")
                r = c.infer("simple_identity", [i], outputs=[o])
                assert len(r.as_numpy("OUTPUT0")[0][0]) == size

            def shared():
                i = module.InferInput("INPUT0", [1, 1], "BYTES")
                i.set_shared_memory(f"{tag}_in", nbytes)
                o = module.InferRequestedOutput("OUTPUT0")
                o.set_shared_memory(f"{tag}_out", nbytes)
                c.infer("simple_identity", [i], outputs=[o])

            run(f"{proto} binary tensor", binary, a.n, size)
            run(f"{proto} system shared memory", shared, a.n, size)
            out = shm.get_contents_as_numpy(h_out, np.object_, [1, 1])
            assert out[0][0] == data[0][0]
            c.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)


if __name__ == "__main__":
    main()
