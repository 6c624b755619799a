/* A backend that fails where it is told to: the backend config
   (--backend-config capi_failing,fail_in=initialize) or the model's
   config parameter fail_in = model_initialize | instance_initialize |
   execute (the whole execute call fails) | request (requests whose
   INPUT0[0] is negative get an error response; others are echoed as
   OUTPUT0). */
#include "common.h"

static int model_says(TRITONBACKEND_Model* model, const char* where)
{
  TRITONSERVER_Message* config = NULL;
  if (TRITONBACKEND_ModelConfig(model, 1, &config) != NULL) return 0;
  char needle[128];
  snprintf(needle, sizeof needle, "\"fail_in\":{\"string_value\":\"%s\"}", where);
  int found = message_contains(config, needle);
  TRITONSERVER_MessageDelete(config);
  return found;
}

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend)
{
  TRITONSERVER_Message* config = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_BackendConfig(backend, &config));
  int fail = message_contains(config, "\"fail_in\":\"initialize\"");
  TRITONSERVER_MessageDelete(config);
  if (fail) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "failing backend: TRITONBACKEND_Initialize fails as told");
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model)
{
  if (model_says(model, "model_initialize"))
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "failing backend: ModelInitialize fails as told");
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance)
{
  TRITONBACKEND_Model* model = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
  if (model_says(model, "instance_initialize"))
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "failing backend: ModelInstanceInitialize fails as told");
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, const uint32_t count)
{
  TRITONBACKEND_Model* model = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
  if (model_says(model, "execute"))
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "failing backend: execute fails as told");
  for (uint32_t r = 0; r < count; r++) {
    TRITONBACKEND_Request* request = requests[r];
    TRITONBACKEND_Input* input = NULL;
    const void* buffer = NULL;
    uint64_t size = 0;
    TRITONSERVER_MemoryType mt = TRITONSERVER_MEMORY_CPU;
    int64_t mid = 0;
    TRITONSERVER_Error* err = TRITONBACKEND_RequestInput(request, "INPUT0", &input);
    if (err == NULL) err = TRITONBACKEND_InputBuffer(input, 0, &buffer, &size, &mt, &mid);
    if (err == NULL && size >= 4 && *(const int32_t*)buffer < 0)
      err = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "failing backend: negative input refused");
    if (err != NULL) {
      fail_request(request, err);
      continue;
    }
    TRITONBACKEND_Response* response = NULL;
    err = TRITONBACKEND_ResponseNew(&response, request);
    if (err != NULL) {
      fail_request(request, err);
      continue;
    }
    err = copy_tensor(request, response, "INPUT0", "OUTPUT0");
    TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err));
    TRITONSERVER_ErrorDelete(err);
    TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  return NULL;
}
