/* Lifecycle backend: records each lifecycle call, and each execution, as
   one line appended to the file the model parameter "lifecycle_log"
   names, with the calling thread's id:
     backend_initialize
     model_initialize <model>
     instance_initialize <instance> <tid>
     execute <instance> <tid>
     instance_finalize <instance> <tid>
     model_finalize <model>
     backend_finalize
   The model parameter "finalize_sleep_ms" makes ModelInstanceFinalize
   sleep that long first (a hanging finalizer), "execute_sleep_ms" each
   execution (one still running at the exit timeout), "initialize_sleep_ms"
   ModelInitialize (a load that hangs). Executions copy INPUT0 to
   OUTPUT0. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

/* The log of the first model loaded: the backend's own lines go there. */
static char backend_log[1024];
static pthread_mutex_t backend_log_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
  char log[1024];
  long finalize_sleep_ms;
  long execute_sleep_ms;
} ModelState;

static void sleep_ms(long ms)
{
  if (ms <= 0) return;
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static long tid(void) { return (long)syscall(SYS_gettid); }

/* One write(2) per line on an O_APPEND descriptor: lines stay whole. */
static void append_line(const char* path, const char* line)
{
  if (path[0] == 0) return;
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  ssize_t n = write(fd, line, strlen(line));
  (void)n;
  close(fd);
}

/* The string_value of parameter 'key' in the model's JSON config. */
static int parameter(const char* json, const char* key, char* out, size_t cap)
{
  char quoted[128];
  snprintf(quoted, sizeof quoted, "\"%s\"", key);
  const char* at = strstr(json, quoted);
  if (at == NULL) return 0;
  const char* value = strstr(at, "\"string_value\":\"");
  if (value == NULL) return 0;
  value += strlen("\"string_value\":\"");
  const char* end = strchr(value, '"');
  if (end == NULL || (size_t)(end - value) >= cap) return 0;
  memcpy(out, value, end - value);
  out[end - value] = 0;
  return 1;
}

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend)
{
  (void)backend;
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_Finalize(TRITONBACKEND_Backend* backend)
{
  (void)backend;
  pthread_mutex_lock(&backend_log_lock);
  append_line(backend_log, "backend_finalize\n");
  pthread_mutex_unlock(&backend_log_lock);
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model)
{
  TRITONSERVER_Message* config = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_ModelConfig(model, 1, &config));
  const char* json = NULL;
  size_t size = 0;
  TRITONSERVER_Error* err = TRITONSERVER_MessageSerializeToJson(config, &json, &size);
  if (err != NULL) {
    TRITONSERVER_MessageDelete(config);
    return err;
  }
  ModelState* state = (ModelState*)calloc(1, sizeof(ModelState));
  if (state == NULL) {
    TRITONSERVER_MessageDelete(config);
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
  }
  char* text = (char*)malloc(size + 1);
  if (text != NULL) {
    memcpy(text, json, size);
    text[size] = 0;
    parameter(text, "lifecycle_log", state->log, sizeof state->log);
    char ms[32];
    if (parameter(text, "finalize_sleep_ms", ms, sizeof ms)) state->finalize_sleep_ms = atol(ms);
    if (parameter(text, "execute_sleep_ms", ms, sizeof ms)) state->execute_sleep_ms = atol(ms);
    if (parameter(text, "initialize_sleep_ms", ms, sizeof ms)) sleep_ms(atol(ms));
    free(text);
  }
  TRITONSERVER_MessageDelete(config);
  pthread_mutex_lock(&backend_log_lock);
  if (backend_log[0] == 0) {
    memcpy(backend_log, state->log, sizeof backend_log);
    append_line(backend_log, "backend_initialize\n");
  }
  pthread_mutex_unlock(&backend_log_lock);
  const char* name = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
  char line[512];
  snprintf(line, sizeof line, "model_initialize %s\n", name);
  append_line(state->log, line);
  return TRITONBACKEND_ModelSetState(model, state);
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model)
{
  void* vstate = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &vstate));
  ModelState* state = (ModelState*)vstate;
  const char* name = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
  char line[512];
  snprintf(line, sizeof line, "model_finalize %s\n", name);
  if (state != NULL) append_line(state->log, line);
  free(state);
  return NULL;
}

static TRITONSERVER_Error* instance_line(TRITONBACKEND_ModelInstance* instance, const char* what, ModelState** out)
{
  TRITONBACKEND_Model* model = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
  void* vstate = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &vstate));
  ModelState* state = (ModelState*)vstate;
  const char* name = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceName(instance, &name));
  char line[512];
  snprintf(line, sizeof line, "%s %s %ld\n", what, name, tid());
  if (state != NULL) append_line(state->log, line);
  if (out != NULL) *out = state;
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance)
{
  return instance_line(instance, "instance_initialize", NULL);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance)
{
  TRITONBACKEND_Model* model = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
  void* vstate = NULL;
  RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &vstate));
  ModelState* state = (ModelState*)vstate;
  if (state != NULL) sleep_ms(state->finalize_sleep_ms);
  return instance_line(instance, "instance_finalize", NULL);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, const uint32_t count)
{
  ModelState* state = NULL;
  RETURN_IF_ERROR(instance_line(instance, "execute", &state));
  if (state != NULL) sleep_ms(state->execute_sleep_ms);
  for (uint32_t r = 0; r < count; r++) {
    TRITONBACKEND_Request* request = requests[r];
    TRITONBACKEND_Response* response = NULL;
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&response, request);
    if (err != NULL) {
      fail_request(request, err);
      continue;
    }
    err = copy_tensor(request, response, "INPUT0", "OUTPUT0");
    TRITONSERVER_Error* send = TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err);
    TRITONSERVER_ErrorDelete(err);
    TRITONSERVER_ErrorDelete(send);
    TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  return NULL;
}
