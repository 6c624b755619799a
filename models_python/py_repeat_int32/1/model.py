"""`repeat_int32` in Python: for IN of n elements, n responses (OUT = [IN[i]],
IDX = [i]), response i sent DELAY[i] ms after the previous one, then the
final flag without outputs. The model takes its next request after WAIT[0]
ms, so with WAIT = 0 the responses of several requests interleave."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self._threads = []
        self._lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
            if values.shape != delays.shape:
                sender.send(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(
                            f"expected DELAY shape {list(values.shape)}, got {list(delays.shape)}"
                        )
                    ),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            thread = threading.Thread(
                target=self._respond, args=(sender, values, delays), daemon=True
            )
            with self._lock:
                self._threads = [t for t in self._threads if t.is_alive()]
                self._threads.append(thread)
            thread.start()
            time.sleep(int(wait[0]) / 1000.0)
        return None

    def _respond(self, sender, values, delays):
        for i, (value, delay) in enumerate(zip(values, delays)):
            time.sleep(int(delay) / 1000.0)
            sender.send(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                        pb_utils.Tensor("IDX", np.array([i], dtype=np.uint32)),
                    ]
                )
            )
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout=10)
