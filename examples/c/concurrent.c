/*
 * Runs several chat requests at once on one engine (they decode together in a batch) and
 * prints each answer when it is complete, then the engine's statistics.
 *
 *   concurrent [--model <dir or .gguf>] [--max-tokens N] [--cancel-first-after N] [questions...]
 *
 * --cancel-first-after N cancels the first request from inside its callback after N tokens.
 * Build like chat.c:
 *
 *   cc -std=c99 -Wall -Iinclude examples/c/concurrent.c -Ltarget/release -lweft_ffi \
 *      -Wl,-rpath,$PWD/target/release -lpthread -o concurrent
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft.h"

typedef struct {
  int index;
  weft_engine *engine;
  int cancel_after; /* 0 = never */
  char *text;       /* the answer so far (NUL-terminated) */
  size_t len;
  unsigned tokens;
  const char *outcome;
} row;

/* Everything the callbacks share with main. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_remaining;

static void on_event(void *user_data, const weft_event *ev) {
  row *r = (row *)user_data;
  if (ev->kind != WEFT_EVENT_ERROR) { /* TOKEN text; DONE carries the held-back tail */
    char *grown = (char *)realloc(r->text, r->len + ev->text_len + 1);
    if (grown == NULL) return;
    r->text = grown;
    memcpy(r->text + r->len, ev->text, ev->text_len);
    r->len += ev->text_len;
    r->text[r->len] = '\0';
  }
  if (ev->kind == WEFT_EVENT_TOKEN) {
    r->tokens++;
    if (r->cancel_after > 0 && r->tokens == (unsigned)r->cancel_after) {
      weft_cancel(r->engine, ev->request_id); /* allowed inside a callback */
    }
    return;
  }
  /* The final event: DONE or ERROR. Print the whole answer at once so rows do not interleave. */
  pthread_mutex_lock(&g_mu);
  if (ev->kind == WEFT_EVENT_DONE) {
    static const char *reasons[] = {"stop", "length", "cancelled"};
    r->outcome = ev->finish_reason >= 0 && ev->finish_reason <= 2 ? reasons[ev->finish_reason] : "?";
    printf("=== request %d (id %llu): %u tokens, %s ===\n%s\n\n", r->index,
           (unsigned long long)ev->request_id, ev->completion_tokens, r->outcome, r->text ? r->text : "");
  } else {
    r->outcome = "error";
    printf("=== request %d (id %llu): error: %.*s ===\n\n", r->index, (unsigned long long)ev->request_id,
           (int)ev->message_len, ev->message);
  }
  fflush(stdout);
  g_remaining--;
  pthread_cond_signal(&g_cv);
  pthread_mutex_unlock(&g_mu);
}

/* Writes `text` as a JSON string literal (quotes included) into out; returns the length needed. */
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
  static const char *default_questions[] = {
      "What is the capital of France?",
      "Name three primary colors.",
      "Write a haiku about the sea.",
      "What is 12 times 12?",
  };
  const char **questions = default_questions;
  int n_questions = 4, max_tokens = 64, cancel_first_after = 0, i, failed = 0;
  const char *model = NULL;
  char *buf;
  size_t cap, n, stats_len = 0;
  weft_engine *engine = NULL;
  row *rows;
  int32_t st;

  for (i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
      model = argv[++i];
    } else if (strcmp(argv[i], "--max-tokens") == 0 && i + 1 < argc) {
      max_tokens = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--cancel-first-after") == 0 && i + 1 < argc) {
      cancel_first_after = atoi(argv[++i]);
    } else {
      questions = (const char **)&argv[i];
      n_questions = argc - i;
      break;
    }
  }

  cap = 64 + (model ? strlen(model) * 6 : 0);
  buf = (char *)malloc(cap);
  n = (size_t)snprintf(buf, cap, "{\"max_batch\": 8, \"model\": ");
  n += model ? json_string(buf + n, cap - n, model) : (size_t)snprintf(buf + n, cap - n, "null");
  snprintf(buf + n, cap - n, "}");
  st = weft_engine_new(buf, &engine);
  free(buf);
  if (st != WEFT_OK) {
    fprintf(stderr, "weft_engine_new: %s: %s\n", weft_status_string(st), weft_last_error());
    return 1;
  }

  rows = (row *)calloc((size_t)n_questions, sizeof(row));
  g_remaining = 0;
  for (i = 0; i < n_questions; i++) {
    rows[i].index = i;
    rows[i].engine = engine;
    rows[i].cancel_after = i == 0 ? cancel_first_after : 0;
    cap = 128 + strlen(questions[i]) * 6;
    buf = (char *)malloc(cap);
    n = (size_t)snprintf(buf, cap, "{\"messages\": [{\"role\": \"user\", \"content\": ");
    n += json_string(buf + n, cap - n, questions[i]);
    snprintf(buf + n, cap - n, "}], \"max_tokens\": %d}", max_tokens);
    pthread_mutex_lock(&g_mu); /* the request may finish before weft_submit returns */
    g_remaining++;
    pthread_mutex_unlock(&g_mu);
    st = weft_submit(engine, buf, on_event, &rows[i], NULL);
    free(buf);
    if (st != WEFT_OK) {
      fprintf(stderr, "request %d: %s: %s\n", i, weft_status_string(st), weft_last_error());
      pthread_mutex_lock(&g_mu);
      g_remaining--;
      pthread_mutex_unlock(&g_mu);
      failed = 1;
    }
  }

  pthread_mutex_lock(&g_mu);
  while (g_remaining > 0) pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);

  /* Statistics: ask for the size first, then fetch. */
  if (weft_engine_stats(engine, NULL, 0, &stats_len) == WEFT_ERR_CAPACITY) {
    buf = (char *)malloc(stats_len + 1);
    if (weft_engine_stats(engine, buf, stats_len + 1, &stats_len) == WEFT_OK) printf("stats: %s\n", buf);
    free(buf);
  }

  weft_engine_free(engine);
  for (i = 0; i < n_questions; i++) {
    if (rows[i].outcome == NULL || strcmp(rows[i].outcome, "error") == 0) failed = 1;
    free(rows[i].text);
  }
  free(rows);
  return failed;
}
