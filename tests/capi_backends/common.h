/* Helpers shared by the test backends (compiled against the project's
   header, include/shardserve/tritonbackend.h). */
#ifndef CAPI_TEST_COMMON_H
#define CAPI_TEST_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardserve/tritonbackend.h"

#define RETURN_IF_ERROR(X)               \
  do {                                   \
    TRITONSERVER_Error* err__ = (X);     \
    if (err__ != NULL) return err__;     \
  } while (0)

static inline TRITONSERVER_Error* errorf(TRITONSERVER_Error_Code code, const char* fmt, const char* arg)
{
  char msg[512];
  snprintf(msg, sizeof msg, fmt, arg);
  return TRITONSERVER_ErrorNew(code, msg);
}

/* Whether the JSON text of 'message' contains 'needle'. */
static inline int message_contains(TRITONSERVER_Message* message, const char* needle)
{
  const char* base = NULL;
  size_t size = 0;
  if (TRITONSERVER_MessageSerializeToJson(message, &base, &size) != NULL) return 0;
  char* text = (char*)malloc(size + 1);
  if (text == NULL) return 0;
  memcpy(text, base, size);
  text[size] = 0;
  int found = strstr(text, needle) != NULL;
  free(text);
  return found;
}

/* Sends an error response for 'request' and releases it. */
static inline void fail_request(TRITONBACKEND_Request* request, TRITONSERVER_Error* error)
{
  TRITONBACKEND_Response* response = NULL;
  if (TRITONBACKEND_ResponseNew(&response, request) == NULL) {
    TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error);
  }
  TRITONSERVER_ErrorDelete(error);
  TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL);
}

/* Copies input 'input_name' of 'request' into output 'output_name' of
   'response' (same datatype and shape). */
static inline TRITONSERVER_Error* copy_tensor(
    TRITONBACKEND_Request* request, TRITONBACKEND_Response* response,
    const char* input_name, const char* output_name)
{
  TRITONBACKEND_Input* input = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_RequestInput(request, input_name, &input));
  TRITONSERVER_DataType dt;
  const int64_t* shape;
  uint32_t dims, buffers;
  uint64_t size;
  RETURN_IF_ERROR(TRITONBACKEND_InputProperties(input, NULL, &dt, &shape, &dims, &size, &buffers));
  TRITONBACKEND_Output* output = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_ResponseOutput(response, &output, output_name, dt, shape, dims));
  void* out = NULL;
  TRITONSERVER_MemoryType mt = TRITONSERVER_MEMORY_CPU;
  int64_t mid = 0;
  RETURN_IF_ERROR(TRITONBACKEND_OutputBuffer(output, &out, size, &mt, &mid));
  uint64_t offset = 0;
  for (uint32_t b = 0; b < buffers; b++) {
    const void* in = NULL;
    uint64_t n = 0;
    TRITONSERVER_MemoryType imt = TRITONSERVER_MEMORY_CPU;
    int64_t imid = 0;
    RETURN_IF_ERROR(TRITONBACKEND_InputBuffer(input, b, &in, &n, &imt, &imid));
    memcpy((char*)out + offset, in, n);
    offset += n;
  }
  return NULL;
}

#endif
