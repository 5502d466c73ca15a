/*
 * Streams one chat answer, printing tokens as they arrive.
 *
 *   chat [--model <dir or .gguf>] [--max-tokens N] ["question"]
 *
 * Without --model it uses the default model (SmolLM2-135M-Instruct, downloaded on first use).
 * Build (from the repository root, after `cargo build --release -p weft-ffi`):
 *
 *   cc -std=c99 -Wall -Iinclude examples/c/chat.c -Ltarget/release -lweft_ffi \
 *      -Wl,-rpath,$PWD/target/release -lpthread -o chat
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft.h"

/* Shared between main and the callback (which runs on the request's delivery thread). */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  int failed;
} stream;

static void on_event(void *user_data, const weft_event *ev) {
  stream *s = (stream *)user_data;
  if (ev->kind != WEFT_EVENT_ERROR) { /* TOKEN text, then DONE's held-back tail */
    fwrite(ev->text, 1, ev->text_len, stdout);
    fflush(stdout);
  }
  if (ev->kind == WEFT_EVENT_TOKEN) return;
  if (ev->kind == WEFT_EVENT_DONE) {
    static const char *reasons[] = {"stop", "length", "cancelled"};
    fprintf(stderr, "\n[%s: %u prompt + %u completion tokens]\n",
            ev->finish_reason >= 0 && ev->finish_reason <= 2 ? reasons[ev->finish_reason] : "?",
            ev->prompt_tokens, ev->completion_tokens);
  } else {
    fprintf(stderr, "\nerror: %.*s\n", (int)ev->message_len, ev->message);
  }
  pthread_mutex_lock(&s->mu);
  s->done = 1;
  s->failed = ev->kind == WEFT_EVENT_ERROR;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* Appends `text` to `out` as a JSON string literal (quotes included). */
static size_t json_string(char *out, size_t cap, const char *text) {
  size_t n = 0;
  const unsigned char *p;
  if (n < cap) out[n] = '"';
  n++;
  for (p = (const unsigned char *)text; *p; p++) {
    char esc[8];
    size_t k, len;
    if (*p == '"' || *p == '\\') {
      esc[0] = '\\'; esc[1] = (char)*p; len = 2;
    } else if (*p < 0x20) {
      len = (size_t)snprintf(esc, sizeof esc, "\\u%04x", *p);
    } else {
      esc[0] = (char)*p; len = 1;
    }
    for (k = 0; k < len; k++, n++) {
      if (n < cap) out[n] = esc[k];
    }
  }
  if (n < cap) out[n] = '"';
  n++;
  return n;
}

int main(int argc, char **argv) {
  const char *model = NULL, *question = "What is the capital of France? Answer in one sentence.";
  int max_tokens = 128, i;
  char *options, *request;
  size_t cap, n;
  weft_engine *engine = NULL;
  stream s;
  int32_t st;

  for (i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
      model = argv[++i];
    } else if (strcmp(argv[i], "--max-tokens") == 0 && i + 1 < argc) {
      max_tokens = atoi(argv[++i]);
    } else {
      question = argv[i];
    }
  }
  if (weft_abi_version() != WEFT_ABI_VERSION) {
    fprintf(stderr, "libweft ABI %u, built against %d\n", weft_abi_version(), WEFT_ABI_VERSION);
    return 1;
  }

  cap = 64 + (model ? 2 * strlen(model) * 6 : 0);
  options = (char *)malloc(cap);
  n = (size_t)snprintf(options, cap, "{\"model\": ");
  n += model ? json_string(options + n, cap - n, model) : (size_t)snprintf(options + n, cap - n, "null");
  snprintf(options + n, cap - n, "}");

  st = weft_engine_new(options, &engine);
  free(options);
  if (st != WEFT_OK) {
    fprintf(stderr, "weft_engine_new: %s: %s\n", weft_status_string(st), weft_last_error());
    return 1;
  }

  cap = 128 + strlen(question) * 6;
  request = (char *)malloc(cap);
  n = (size_t)snprintf(request, cap, "{\"messages\": [{\"role\": \"user\", \"content\": ");
  n += json_string(request + n, cap - n, question);
  snprintf(request + n, cap - n, "}], \"max_tokens\": %d}", max_tokens);

  pthread_mutex_init(&s.mu, NULL);
  pthread_cond_init(&s.cv, NULL);
  s.done = 0;
  s.failed = 0;
  st = weft_submit(engine, request, on_event, &s, NULL);
  free(request);
  if (st != WEFT_OK) {
    fprintf(stderr, "weft_submit: %s: %s\n", weft_status_string(st), weft_last_error());
    weft_engine_free(engine);
    return 1;
  }
  pthread_mutex_lock(&s.mu);
  while (!s.done) pthread_cond_wait(&s.cv, &s.mu);
  pthread_mutex_unlock(&s.mu);

  weft_engine_free(engine);
  pthread_mutex_destroy(&s.mu);
  pthread_cond_destroy(&s.cv);
  return s.failed ? 1 : 0;
}
