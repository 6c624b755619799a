/* Stateful accumulator using the state API: OUTPUT = ACC, where ACC is
   the sequence's running sum of INPUT (restarted at START), kept as the
   implicit state OUTPUT_STATE (input INPUT_STATE). Each response also
   says the request's correlation id and flags as parameters. */
#include "common.h"

static TRITONSERVER_Error* read_i32(TRITONBACKEND_Request* request, const char* name, int32_t* value)
{
  TRITONBACKEND_Input* input = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_RequestInput(request, name, &input));
  const void* buffer = NULL;
  uint64_t size = 0;
  TRITONSERVER_MemoryType mt = TRITONSERVER_MEMORY_CPU;
  int64_t mid = 0;
  RETURN_IF_ERROR(TRITONBACKEND_InputBuffer(input, 0, &buffer, &size, &mt, &mid));
  if (size < 4) return errorf(TRITONSERVER_ERROR_INVALID_ARG, "input '%s' is empty", name);
  memcpy(value, buffer, 4);
  return NULL;
}

static TRITONSERVER_Error* accumulate(TRITONBACKEND_Request* request, TRITONBACKEND_Response* response)
{
  uint32_t flags = 0;
  uint64_t corrid = 0;
  RETURN_IF_ERROR(TRITONBACKEND_RequestFlags(request, &flags));
  RETURN_IF_ERROR(TRITONBACKEND_RequestCorrelationId(request, &corrid));
  int32_t input = 0, state = 0;
  RETURN_IF_ERROR(read_i32(request, "INPUT", &input));
  RETURN_IF_ERROR(read_i32(request, "INPUT_STATE", &state));
  if (flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START) state = 0;
  int32_t sum = state + input;

  int64_t shape[2] = {1, 1};
  TRITONBACKEND_State* st = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_StateNew(&st, request, "OUTPUT_STATE", TRITONSERVER_TYPE_INT32, shape, 2));
  void* buffer = NULL;
  TRITONSERVER_MemoryType mt = TRITONSERVER_MEMORY_CPU;
  int64_t mid = 0;
  RETURN_IF_ERROR(TRITONBACKEND_StateBuffer(st, &buffer, 4, &mt, &mid));
  memcpy(buffer, &sum, 4);
  RETURN_IF_ERROR(TRITONBACKEND_StateUpdate(st));

  TRITONBACKEND_Output* out = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_ResponseOutput(response, &out, "OUTPUT", TRITONSERVER_TYPE_INT32, shape, 2));
  RETURN_IF_ERROR(TRITONBACKEND_OutputBuffer(out, &buffer, 4, &mt, &mid));
  memcpy(buffer, &sum, 4);
  RETURN_IF_ERROR(TRITONBACKEND_ResponseSetIntParameter(response, "correlation_id", (int64_t)corrid));
  RETURN_IF_ERROR(TRITONBACKEND_ResponseSetIntParameter(response, "flags", (int64_t)flags));
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, const uint32_t count)
{
  (void)instance;
  for (uint32_t r = 0; r < count; r++) {
    TRITONBACKEND_Response* response = NULL;
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&response, requests[r]);
    if (err != NULL) {
      fail_request(requests[r], err);
      continue;
    }
    err = accumulate(requests[r], response);
    TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err));
    TRITONSERVER_ErrorDelete(err);
    TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  return NULL;
}
