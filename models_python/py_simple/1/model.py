"""`simple` in Python: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1
(INT32, wrapping on overflow)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            with np.errstate(over="ignore"):
                total = (in0 + in1).astype(np.int32)
                difference = (in0 - in1).astype(np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", total),
                        pb_utils.Tensor("OUTPUT1", difference),
                    ]
                )
            )
        return responses
