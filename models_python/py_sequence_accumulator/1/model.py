"""`sequence_accumulator` in Python: a running sum per sequence, keyed by the
request's correlation ID, driven by the START/END/READY control inputs the
sequence batcher adds to every request. Counts the sequences it starts in a
custom metric (`py_sequence_accumulator_starts`, on the metrics endpoint)."""

import numpy as np
import triton_python_backend_utils as pb_utils


def _flag(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return tensor is not None and int(tensor.as_numpy().reshape(-1)[0]) != 0


class TritonPythonModel:
    def initialize(self, args):
        self._sums = {}
        self._family = pb_utils.MetricFamily(
            name="py_sequence_accumulator_starts",
            description="Sequences started (requests with START = 1)",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self._starts = self._family.Metric(labels={"model": args["model_name"]})

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            key = request.correlation_id()
            if not _flag(request, "READY"):
                out = np.zeros_like(value, dtype=np.int32)
            else:
                with np.errstate(over="ignore"):
                    if _flag(request, "START") or key not in self._sums:
                        total = value.astype(np.int32)
                        self._starts.increment(1)
                    else:
                        total = (self._sums[key] + value).astype(np.int32)
                self._sums[key] = total
                out = total
                if _flag(request, "END"):
                    self._sums.pop(key, None)
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", out)])
            )
        return responses
