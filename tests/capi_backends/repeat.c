/* Decoupled repeat backend (the repeat_int32 contract, without DELAY and
   WAIT): for input IN[n] it sends n responses OUT=[IN[i]], IDX=[i] from a
   thread of its own, after the request was released and execute
   returned, then the final flag alone. Stops early when the request is
   cancelled. */
#include <pthread.h>

#include "common.h"

typedef struct {
  TRITONBACKEND_ResponseFactory* factory;
  int32_t* values;
  uint32_t count;
} Job;

static TRITONSERVER_Error* send_one(TRITONBACKEND_ResponseFactory* factory, int32_t value, uint32_t idx)
{
  TRITONBACKEND_Response* response = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_ResponseNewFromFactory(&response, factory));
  int64_t shape[1] = {1};
  TRITONBACKEND_Output* out = NULL;
  void* buffer = NULL;
  TRITONSERVER_MemoryType mt = TRITONSERVER_MEMORY_CPU;
  int64_t mid = 0;
  TRITONSERVER_Error* err = TRITONBACKEND_ResponseOutput(response, &out, "OUT", TRITONSERVER_TYPE_INT32, shape, 1);
  if (err == NULL) err = TRITONBACKEND_OutputBuffer(out, &buffer, 4, &mt, &mid);
  if (err == NULL) memcpy(buffer, &value, 4);
  if (err == NULL) err = TRITONBACKEND_ResponseOutput(response, &out, "IDX", TRITONSERVER_TYPE_UINT32, shape, 1);
  if (err == NULL) err = TRITONBACKEND_OutputBuffer(out, &buffer, 4, &mt, &mid);
  if (err == NULL) memcpy(buffer, &idx, 4);
  if (err != NULL) {
    TRITONBACKEND_ResponseDelete(response);
    return err;
  }
  return TRITONBACKEND_ResponseSend(response, 0, NULL);
}

static void* run(void* arg)
{
  Job* job = (Job*)arg;
  for (uint32_t i = 0; i < job->count; i++) {
    bool cancelled = false;
    TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseFactoryIsCancelled(job->factory, &cancelled));
    if (cancelled) break;
    TRITONSERVER_Error* err = send_one(job->factory, job->values[i], i);
    if (err != NULL) {
      TRITONSERVER_ErrorDelete(err);
      break;
    }
  }
  TRITONSERVER_ErrorDelete(TRITONBACKEND_ResponseFactorySendFlags(job->factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL));
  TRITONBACKEND_ResponseFactoryDelete(job->factory);
  free(job->values);
  free(job);
  return NULL;
}

static TRITONSERVER_Error* start(TRITONBACKEND_Request* request)
{
  TRITONBACKEND_Input* input = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_RequestInput(request, "IN", &input));
  uint64_t size = 0;
  uint32_t buffers = 0;
  RETURN_IF_ERROR(TRITONBACKEND_InputProperties(input, NULL, NULL, NULL, NULL, &size, &buffers));
  Job* job = (Job*)calloc(1, sizeof(Job));
  if (job == NULL) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
  job->values = (int32_t*)malloc(size + 1);
  job->count = (uint32_t)(size / 4);
  uint64_t offset = 0;
  for (uint32_t b = 0; b < buffers; b++) {
    const void* in = NULL;
    uint64_t n = 0;
    TRITONSERVER_MemoryType mt = TRITONSERVER_MEMORY_CPU;
    int64_t mid = 0;
    TRITONSERVER_Error* err = TRITONBACKEND_InputBuffer(input, b, &in, &n, &mt, &mid);
    if (err != NULL) {
      free(job->values);
      free(job);
      return err;
    }
    memcpy((char*)job->values + offset, in, n);
    offset += n;
  }
  TRITONSERVER_Error* err = TRITONBACKEND_ResponseFactoryNew(&job->factory, request);
  if (err != NULL) {
    free(job->values);
    free(job);
    return err;
  }
  pthread_t thread;
  if (pthread_create(&thread, NULL, run, job) != 0) {
    TRITONBACKEND_ResponseFactoryDelete(job->factory);
    free(job->values);
    free(job);
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "cannot start a thread");
  }
  pthread_detach(thread);
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, const uint32_t count)
{
  (void)instance;
  for (uint32_t r = 0; r < count; r++) {
    TRITONSERVER_Error* err = start(requests[r]);
    if (err != NULL) {
      fail_request(requests[r], err);
      continue;
    }
    /* Inputs were copied: the request can go before any response. */
    TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  return NULL;
}
