"""BLS: answers each request by sending its inputs to another model of the
same server (the `target_model` parameter, `simple` by default) through
the server's in-process API, and returning that model's outputs.

With the request parameter `via` = "repeat" it calls the decoupled
`py_repeat_int32` instead (one response per element of INPUT0's row),
and returns the collected OUT values as OUTPUT0 and IDX as OUTPUT1."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _error(message):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        self._target = parameters.get("target_model", {}).get("string_value", "simple")

    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters() or "{}")
            if params.get("via") == "repeat":
                responses.append(self._via_repeat(request))
            else:
                responses.append(self._via_target(request))
        return responses

    def _via_target(self, request):
        inputs = [
            pb_utils.get_input_tensor_by_name(request, "INPUT0"),
            pb_utils.get_input_tensor_by_name(request, "INPUT1"),
        ]
        answer = pb_utils.InferenceRequest(
            model_name=self._target,
            requested_output_names=["OUTPUT0", "OUTPUT1"],
            inputs=inputs,
        ).exec()
        if answer.has_error():
            return _error(f"BLS request to '{self._target}' failed: {answer.error().message()}")
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.get_output_tensor_by_name(answer, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(answer, "OUTPUT1"),
            ]
        )

    def _via_repeat(self, request):
        row = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        values = row.reshape(-1).astype(np.int32)
        stream = pb_utils.InferenceRequest(
            model_name="py_repeat_int32",
            requested_output_names=["OUT", "IDX"],
            inputs=[
                pb_utils.Tensor("IN", values),
                pb_utils.Tensor("DELAY", np.zeros(values.shape, dtype=np.uint32)),
                pb_utils.Tensor("WAIT", np.zeros([1], dtype=np.uint32)),
            ],
        ).exec(decoupled=True)
        outs, idxs = [], []
        for answer in stream:
            if answer.has_error():
                return _error(f"BLS request to 'py_repeat_int32' failed: {answer.error().message()}")
            out = pb_utils.get_output_tensor_by_name(answer, "OUT")
            if out is None:
                # The final flag arrives as an empty response.
                continue
            outs.append(int(out.as_numpy()[0]))
            idxs.append(int(pb_utils.get_output_tensor_by_name(answer, "IDX").as_numpy()[0]))
        if len(outs) != values.size:
            return _error(f"expected {values.size} responses from py_repeat_int32, got {len(outs)}")
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("OUTPUT0", np.array(outs, dtype=np.int32).reshape(row.shape)),
                pb_utils.Tensor("OUTPUT1", np.array(idxs, dtype=np.int32).reshape(row.shape)),
            ]
        )
