#!/usr/bin/env python3
"""CUDA shared memory on a real GPU, end to end: `simple`'s inputs and
outputs in two CUDA regions of GPU 0 made by this process (cupy), registered
with the server by their IPC handles over HTTP, one inference, outputs read
back from the GPU and checked; then the regions are unregistered.

Runs where cupy and a GPU are (the lent device machine); needs no
tritonclient (plain HTTP/JSON, as Triton's protocol defines it).

Usage: device_cuda_shm.py HOST:PORT
"""
import base64
import json
import sys
import urllib.error
import urllib.request

import cupy as cp
import numpy as np


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def region(nbytes):
    # A base allocation of its own: an IPC handle names the whole allocation,
    # so a pool sub-allocation would put the data at an unknown offset.
    ptr = cp.cuda.runtime.malloc(nbytes)
    handle = cp.cuda.runtime.ipcGetMemHandle(ptr)
    mem = cp.cuda.UnownedMemory(ptr, nbytes, None)
    return ptr, handle, cp.ndarray((nbytes // 4,), cp.int32, cp.cuda.MemoryPointer(mem, 0))


def main():
    base = f"http://{sys.argv[1]}"
    a = np.arange(16, dtype=np.int32)
    b = np.full(16, 7, dtype=np.int32)
    in_ptr, in_handle, in_view = region(128)
    out_ptr, out_handle, out_view = region(128)
    in_view[:16] = cp.asarray(a)
    in_view[16:] = cp.asarray(b)
    out_view[:] = -1
    cp.cuda.runtime.deviceSynchronize()
    for name, handle in (("in0", in_handle), ("out0", out_handle)):
        code, body = post(f"{base}/v2/cudasharedmemory/region/{name}/register",
                          {"raw_handle": {"b64": base64.b64encode(handle).decode()},
                           "device_id": 0, "byte_size": 128})
        print(f"register {name}: {code} {body}")
        if code != 200:
            return 1
    with urllib.request.urlopen(f"{base}/v2/cudasharedmemory/status", timeout=30) as r:
        print("status:", r.read().decode())

    def shm(name, offset):
        return {"shared_memory_region": name, "shared_memory_byte_size": 64,
                "shared_memory_offset": offset}

    code, body = post(f"{base}/v2/models/simple/infer", {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": shm("in0", 0)},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "parameters": shm("in0", 64)},
        ],
        "outputs": [
            {"name": "OUTPUT0", "parameters": shm("out0", 0)},
            {"name": "OUTPUT1", "parameters": shm("out0", 64)},
        ],
    })
    print(f"infer: {code} {body}")
    cp.cuda.runtime.deviceSynchronize()
    got = cp.asnumpy(out_view)
    ok = code == 200 and (got[:16] == a + b).all() and (got[16:] == a - b).all()
    print("OUTPUT0 from the GPU:", got[:16].tolist())
    print("OUTPUT1 from the GPU:", got[16:].tolist())
    for name in ("in0", "out0"):
        print(f"unregister {name}:", post(f"{base}/v2/cudasharedmemory/region/{name}/unregister", {}))
    cp.cuda.runtime.free(in_ptr)
    cp.cuda.runtime.free(out_ptr)
    print("CUDA shm round trip:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
