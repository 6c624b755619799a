import numpy as np


def simple_inputs(module, dtype=np.int32, datatype="INT32", batch=1, binary=True):
    """Two [batch,16] inputs for `simple`-shaped models: 0..15 and all ones."""
    a = np.tile(np.arange(16, dtype=dtype), (batch, 1))
    b = np.ones((batch, 16), dtype=dtype)
    inputs = [module.InferInput("INPUT0", [batch, 16], datatype), module.InferInput("INPUT1", [batch, 16], datatype)]
    if module.__name__.endswith("http") or "http" in module.__name__:
        inputs[0].set_data_from_numpy(a, binary_data=binary)
        inputs[1].set_data_from_numpy(b, binary_data=binary)
    else:
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
    return inputs, a, b
