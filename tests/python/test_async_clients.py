"""The asyncio flavours of tritonclient (HTTP via aiohttp, gRPC via grpc.aio)."""

import asyncio

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio

from helpers import simple_inputs


@pytest.mark.asyncio
async def test_http_aio_concurrent_infers(server):
    client = httpaio.InferenceServerClient(server.http_url)
    try:
        assert await client.is_server_ready()
        inputs, a, b = simple_inputs(httpaio)
        results = await asyncio.gather(*[client.infer("simple", inputs) for _ in range(32)])
        for r in results:
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_grpc_aio_concurrent_infers(server):
    client = grpcaio.InferenceServerClient(server.grpc_url)
    try:
        assert await client.is_server_live()
        meta = await client.get_model_metadata("simple")
        assert meta.name == "simple"
        inputs, a, b = simple_inputs(grpcaio)
        results = await asyncio.gather(*[client.infer("simple", inputs) for _ in range(32)])
        for r in results:
            np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    finally:
        await client.close()
