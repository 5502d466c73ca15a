/* Hostile input through the C ABI (issue 27): the host process must neither abort nor print a
 * panic, and each case must be refused at weft_submit / weft_engine_new with its status and a
 * message naming the problem:
 *   - kv_group_size 3 in the engine options;
 *   - a regex constraint whose counted repetitions expand to a million, at submit;
 *   - a prompt exactly at the model's context (no room for a token); in "full" mode a prompt one
 *     token shorter runs and stops at the context: prompt + completion == context;
 *   - audio clips with absurd headers (4 294 967 295 Hz, 1 MHz, 4 MHz, 0 Hz) or too short for the
 *     tower, each refused quickly ("full" mode times them).
 * A constrained request runs to completion before the engine is freed (valgrind checks that
 * its constraint state is freed with the engine). Prints PASS or FAIL lines.
 *   hardening_test <model.gguf> <context> <audio model dir> <cases file> full|valgrind
 * The cases file has one clip per line: <expected message part> TAB <data: URL>. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "weft.h"

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done, finish, tokens;
  uint32_t prompt_tokens, completion_tokens;
} row;

static void on_event(void *user_data, const weft_event *ev) {
  row *r = (row *)user_data;
  pthread_mutex_lock(&r->mu);
  if (ev->kind == WEFT_EVENT_TOKEN) r->tokens++;
  if (ev->kind != WEFT_EVENT_TOKEN) {
    r->done = ev->kind == WEFT_EVENT_DONE ? 1 : -1;
    r->finish = ev->finish_reason;
    r->prompt_tokens = ev->prompt_tokens;
    r->completion_tokens = ev->completion_tokens;
    pthread_cond_broadcast(&r->cv);
  }
  pthread_mutex_unlock(&r->mu);
}

static void row_init(row *r) {
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
}

static void row_wait(row *r) {
  pthread_mutex_lock(&r->mu);
  while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
  pthread_mutex_unlock(&r->mu);
}

static int failures = 0;

static void check(int ok, const char *what) {
  printf("%s %s\n", ok ? "PASS" : "FAIL", what);
  if (!ok) {
    printf("  (last error: %s)\n", weft_last_error());
    failures++;
  }
  fflush(stdout);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* {"prompt_ids": [7, 7, ..., 7] (n ids), "max_tokens": 4, "ignore_eos": true} */
static char *prompt_of(int n) {
  char *text = malloc((size_t)n * 2 + 64);
  size_t len = (size_t)sprintf(text, "{\"prompt_ids\": [");
  int i;
  for (i = 0; i < n; i++) len += (size_t)sprintf(text + len, "%s7", i ? "," : "");
  sprintf(text + len, "], \"max_tokens\": 4, \"ignore_eos\": true}");
  return text;
}

static void text_model_cases(const char *model, int context, int full) {
  weft_engine *engine = NULL;
  char options[4096];
  row r;
  char *text;
  int32_t st;
  double t0;

  snprintf(options, sizeof options, "{\"model\": \"%s\", \"kv_group_size\": 3}", model);
  st = weft_engine_new(options, &engine);
  check(st == WEFT_ERR_INVALID_ARGUMENT && engine == NULL, "kv_group_size 3 is WEFT_ERR_INVALID_ARGUMENT");
  check(strstr(weft_last_error(), "kv_group_size must be 32, 64 or 128, got 3") != NULL, "its message names the group sizes");

  snprintf(options, sizeof options, "{\"model\": \"%s\"}", model);
  if (weft_engine_new(options, &engine) != WEFT_OK) {
    printf("FAIL weft_engine_new: %s\n", weft_last_error());
    failures++;
    return;
  }
  /* A constrained request served to the end (its grammar state must be freed with the engine). */
  row_init(&r);
  st = weft_submit(engine, "{\"prompt_ids\": [1, 2, 3], \"max_tokens\": 8, \"regex\": \"[ab]{4}\"}", on_event, &r, NULL);
  check(st == WEFT_OK, "a regex-constrained request is accepted");
  if (st == WEFT_OK) {
    row_wait(&r);
    check(r.done == 1 && r.finish == WEFT_FINISH_STOP && r.tokens >= 1, "it completes with its match");
  }

  t0 = now_s();
  st = weft_submit(engine, "{\"prompt_ids\": [1, 2, 3], \"max_tokens\": 8, \"regex\": \"(a{1000}){1000}\"}", on_event, &r, NULL);
  check(st == WEFT_ERR_INVALID_ARGUMENT, "regex (a{1000}){1000} is refused at submit");
  check(strstr(weft_last_error(), "regex:") != NULL && strstr(weft_last_error(), "counted repetitions") != NULL,
        "its message names the regex's expansion");
  if (full) check(now_s() - t0 < 1.0, "it is refused within a second");

  text = prompt_of(context);
  st = weft_submit(engine, text, on_event, &r, NULL);
  free(text);
  check(st == WEFT_ERR_INVALID_ARGUMENT && strstr(weft_last_error(), "context") != NULL,
        "a prompt exactly at the context is WEFT_ERR_INVALID_ARGUMENT naming the context");
  if (full) {
    text = prompt_of(context - 1);
    row_init(&r);
    st = weft_submit(engine, text, on_event, &r, NULL);
    free(text);
    check(st == WEFT_OK, "a prompt one token under the context is accepted");
    if (st == WEFT_OK) {
      row_wait(&r);
      check(r.done == 1 && r.finish == WEFT_FINISH_LENGTH && r.completion_tokens == 1 &&
                r.prompt_tokens + r.completion_tokens == (uint32_t)context,
            "it ends with length after one token: prompt + completion == context");
    }
  }
  weft_engine_free(engine);
}

static void audio_cases(const char *model, const char *cases_path, int full) {
  weft_engine *engine = NULL;
  char options[4096];
  FILE *cases = fopen(cases_path, "r");
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  int n = 0;

  if (!cases) {
    printf("FAIL cannot open %s\n", cases_path);
    failures++;
    return;
  }
  snprintf(options, sizeof options, "{\"model\": \"%s\"}", model);
  if (weft_engine_new(options, &engine) != WEFT_OK) {
    printf("FAIL weft_engine_new (audio): %s\n", weft_last_error());
    failures++;
    fclose(cases);
    return;
  }
  while ((len = getline(&line, &cap, cases)) > 0) {
    char *tab = strchr(line, '\t');
    char *request, what[512];
    const char *fmt = "{\"prompt_ids\": [2, 10, 250, 11, 12], \"max_tokens\": 4, \"audio\": [\"%s\"]}";
    size_t size;
    row r;
    int32_t st;
    double t0;
    if (!tab) continue;
    *tab = 0;
    if (line[len - 1] == '\n') line[len - 1] = 0;
    size = strlen(fmt) + strlen(tab + 1) + 1;
    request = malloc(size);
    snprintf(request, size, fmt, tab + 1);
    row_init(&r);
    t0 = now_s();
    st = weft_submit(engine, request, on_event, &r, NULL);
    free(request);
    snprintf(what, sizeof what, "audio case %d is WEFT_ERR_INVALID_ARGUMENT with \"%s\"", n, line);
    check(st == WEFT_ERR_INVALID_ARGUMENT && strstr(weft_last_error(), "audio[0]") != NULL &&
              strstr(weft_last_error(), line) != NULL,
          what);
    if (full) {
      snprintf(what, sizeof what, "audio case %d is refused within a second", n);
      check(now_s() - t0 < 1.0, what);
    }
    n++;
  }
  free(line);
  fclose(cases);
  check(n >= 5, "every audio case ran");
  check(weft_engine_health(engine) == WEFT_OK, "the audio engine is healthy after the refusals");
  weft_engine_free(engine);
}

int main(int argc, char **argv) {
  int full;
  if (argc != 6) {
    fprintf(stderr, "usage: hardening_test <model.gguf> <context> <audio model dir> <cases file> full|valgrind\n");
    return 2;
  }
  full = strcmp(argv[5], "full") == 0;
  text_model_cases(argv[1], atoi(argv[2]), full);
  audio_cases(argv[3], argv[4], full);
  printf("%s\n", failures ? "FAIL hardening_test" : "PASS hardening_test");
  return failures ? 1 : 0;
}
