/* Identity backend: each requested output OUTPUTn is a copy of input
   INPUTn. Every response carries the number of requests its execution
   had ("execution_requests"), so tests can see batching, and echoes the
   request's parameters as "echo_<key>". */
#include "common.h"

static TRITONSERVER_Error* echo_parameters(TRITONBACKEND_Request* request, TRITONBACKEND_Response* response)
{
  uint32_t count = 0;
  RETURN_IF_ERROR(TRITONBACKEND_RequestParameterCount(request, &count));
  for (uint32_t i = 0; i < count; i++) {
    const char* key = NULL;
    TRITONSERVER_ParameterType type;
    const void* value = NULL;
    RETURN_IF_ERROR(TRITONBACKEND_RequestParameter(request, i, &key, &type, &value));
    char name[256];
    snprintf(name, sizeof name, "echo_%s", key);
    switch (type) {
      case TRITONSERVER_PARAMETER_STRING:
        RETURN_IF_ERROR(TRITONBACKEND_ResponseSetStringParameter(response, name, (const char*)value));
        break;
      case TRITONSERVER_PARAMETER_INT:
        RETURN_IF_ERROR(TRITONBACKEND_ResponseSetIntParameter(response, name, *(const int64_t*)value));
        break;
      case TRITONSERVER_PARAMETER_BOOL:
        RETURN_IF_ERROR(TRITONBACKEND_ResponseSetBoolParameter(response, name, *(const bool*)value));
        break;
      case TRITONSERVER_PARAMETER_DOUBLE:
        RETURN_IF_ERROR(TRITONBACKEND_ResponseSetDoubleParameter(response, name, *(const double*)value));
        break;
      default:
        break;
    }
  }
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend)
{
  (void)backend;
  uint32_t major, minor;
  RETURN_IF_ERROR(TRITONBACKEND_ApiVersion(&major, &minor));
  if (major != TRITONBACKEND_API_VERSION_MAJOR || minor < TRITONBACKEND_API_VERSION_MINOR) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, "backend API version mismatch");
  }
  return TRITONSERVER_LogMessage(TRITONSERVER_LOG_INFO, __FILE__, __LINE__, "identity backend initialized");
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, const uint32_t count)
{
  (void)instance;
  for (uint32_t r = 0; r < count; r++) {
    TRITONBACKEND_Request* request = requests[r];
    TRITONBACKEND_Response* response = NULL;
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&response, request);
    if (err != NULL) {
      fail_request(request, err);
      continue;
    }
    uint32_t outputs = 0;
    err = TRITONBACKEND_RequestOutputCount(request, &outputs);
    for (uint32_t o = 0; err == NULL && o < outputs; o++) {
      const char* name = NULL;
      err = TRITONBACKEND_RequestOutputName(request, o, &name);
      if (err != NULL) break;
      if (strncmp(name, "OUTPUT", 6) != 0) {
        err = errorf(TRITONSERVER_ERROR_INVALID_ARG, "unexpected output '%s'", name);
        break;
      }
      char input_name[128];
      snprintf(input_name, sizeof input_name, "INPUT%s", name + 6);
      err = copy_tensor(request, response, input_name, name);
    }
    if (err == NULL) {
      err = TRITONBACKEND_ResponseSetIntParameter(response, "execution_requests", (int64_t)count);
    }
    if (err == NULL) err = echo_parameters(request, response);
    TRITONSERVER_Error* send = TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err);
    TRITONSERVER_ErrorDelete(err);
    TRITONSERVER_ErrorDelete(send);
    TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  return NULL;
}
