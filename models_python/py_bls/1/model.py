"""BLS: answers each request by sending its inputs to another model of the
same server (the `target_model` parameter, `simple` by default) through
the server's in-process API, and returning that model's outputs."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        self._target = parameters.get("target_model", {}).get("string_value", "simple")

    def execute(self, requests):
        responses = []
        for request in requests:
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
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(
                            f"BLS request to '{self._target}' failed: {answer.error().message()}"
                        )
                    )
                )
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.get_output_tensor_by_name(answer, "OUTPUT0"),
                        pb_utils.get_output_tensor_by_name(answer, "OUTPUT1"),
                    ]
                )
            )
        return responses
