/*
 * End-to-end test of the C ABI, driven by tests/c_abi.rs. Compiles as C99 and as C++.
 *
 *   abi_test <model_dir> <cases_file> full|quick|version
 *
 * cases_file (written by tests/c_abi.rs from goldens/<model>.json), one row per line:
 *   <max_tokens> <n_prompt> <prompt ids...> <n_expected> <expected ids...>
 *
 * full:    every case concurrently from its own thread (greedy, ignore_eos) against the goldens,
 *          two cancellations (from a callback and from another thread), submit from a callback,
 *          refused free/shutdown from a callback, a blocked callback holding back only its own
 *          request, every bad-input case, stats, shutdown, free with requests outstanding.
 * quick:   the same with the first 3 cases (for valgrind).
 * version: only the version and status functions (no model).
 * Prints one line per failed check and "PASS <n> checks" or "FAIL <k> of <n> checks".
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "weft.h"

static int g_checks = 0;
static int g_failures = 0;
static pthread_mutex_t g_check_mu = PTHREAD_MUTEX_INITIALIZER;

static void check(int ok, const char *what, const char *detail) {
  pthread_mutex_lock(&g_check_mu);
  g_checks++;
  if (!ok) {
    g_failures++;
    fprintf(stderr, "FAILED: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  }
  pthread_mutex_unlock(&g_check_mu);
}

static void sleep_ms(long ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&ts, NULL);
}

/* Checks a call failed with `want` and left a message containing `needle` (if not NULL). */
static void expect_error(int32_t got, int32_t want, const char *needle, const char *what) {
  char detail[1024];
  const char *msg = weft_last_error();
  snprintf(detail, sizeof detail, "status %d (%s), want %d (%s); message \"%s\"", (int)got,
           weft_status_string(got), (int)want, weft_status_string(want), msg ? msg : "(null)");
  check(got == want, what, detail);
  check(msg != NULL && msg[0] != '\0', what, "weft_last_error is empty");
  if (needle != NULL) {
    check(msg != NULL && strstr(msg, needle) != NULL, what, detail);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* One request's collected events. */

typedef struct row {
  /* the case */
  int max_tokens;
  int n_prompt;
  uint32_t *prompt;
  int n_expected;
  int32_t *expected;
  /* what arrived */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int32_t *got;
  int n_got;
  int n_empty_text; /* TOKEN events whose text was "" with text_len 0 (tokenizer-less model) */
  int finals;
  int completed; /* set after the final callback did everything it does */
  int after_final; /* events after the final one */
  int last_kind;
  int finish_reason;
  uint32_t prompt_tokens, completion_tokens;
  uint64_t event_id;
  uint64_t out_id; /* weft_submit's *out_request_id: written before the first callback */
  int id_mismatch;
  int bad_fields; /* fields that should hold neutral values did not */
  char error[256];
  /* behaviour */
  weft_engine *engine;
  int cancel_after; /* > 0: weft_cancel from inside the callback after this many tokens */
  int try_free_inside; /* call weft_engine_free / shutdown from inside the first callback */
  int free_refused;    /* result of that attempt: 1 if both were refused */
  struct row *followup; /* submitted from inside the callback on the final event */
  int followup_status;
} row;

static void row_init(row *r) {
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  r->finish_reason = -100;
  r->followup_status = -100;
}

static void row_destroy(row *r) {
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r->prompt);
  free(r->expected);
  free(r->got);
}

static char *request_json(const row *r) {
  size_t cap = 128 + (size_t)r->n_prompt * 12;
  char *s = (char *)malloc(cap);
  size_t n = 0;
  int i;
  n += (size_t)snprintf(s + n, cap - n, "{\"prompt_ids\": [");
  for (i = 0; i < r->n_prompt; i++) {
    n += (size_t)snprintf(s + n, cap - n, "%s%u", i ? "," : "", (unsigned)r->prompt[i]);
  }
  snprintf(s + n, cap - n, "], \"max_tokens\": %d, \"ignore_eos\": true}", r->max_tokens);
  return s;
}

static int submit_row(weft_engine *engine, row *r, uint64_t *id);

static void on_event(void *user_data, const weft_event *ev) {
  row *r = (row *)user_data;
  int is_final = ev->kind == WEFT_EVENT_DONE || ev->kind == WEFT_EVENT_ERROR;
  int cancel_now = 0;

  if (r->try_free_inside && ev->kind == WEFT_EVENT_TOKEN && r->n_got == 0) {
    int32_t st;
    weft_engine_free(r->engine); /* refused: must not free, must not deadlock */
    r->free_refused = strstr(weft_last_error(), "inside an event callback") != NULL;
    st = weft_engine_shutdown(r->engine);
    r->free_refused = r->free_refused && st == WEFT_ERR_INVALID_ARGUMENT;
  }

  pthread_mutex_lock(&r->mu);
  if (r->event_id == 0) r->event_id = ev->request_id;
  if (r->event_id != ev->request_id || r->out_id != ev->request_id) r->id_mismatch++;
  if (r->finals > 0) r->after_final++;
  r->last_kind = ev->kind;
  if (ev->text == NULL || ev->message == NULL) r->bad_fields++;
  switch (ev->kind) {
    case WEFT_EVENT_TOKEN:
      r->got = (int32_t *)realloc(r->got, sizeof(int32_t) * (size_t)(r->n_got + 1));
      r->got[r->n_got++] = ev->token_id;
      if (ev->text != NULL && ev->text_len == 0 && ev->text[0] == '\0') r->n_empty_text++;
      if (ev->finish_reason != -1 || ev->message_len != 0 || ev->top_logprobs != NULL ||
          ev->logprob == ev->logprob /* not NaN: logprobs were not requested */) {
        r->bad_fields++;
      }
      if (r->cancel_after > 0 && r->n_got == r->cancel_after) cancel_now = 1;
      break;
    case WEFT_EVENT_DONE:
      r->finals++;
      r->finish_reason = ev->finish_reason;
      r->prompt_tokens = ev->prompt_tokens;
      r->completion_tokens = ev->completion_tokens;
      if (ev->token_id != -1) r->bad_fields++;
      if (ev->finish_reason == WEFT_FINISH_STOP) {
        if (ev->stop_kind == WEFT_STOP_EOS ? ev->stop_token_id < 0 : ev->stop_kind != WEFT_STOP_STRING || ev->stop_string_len == 0)
          r->bad_fields++;
      } else if (ev->stop_kind != WEFT_STOP_NONE || ev->stop_token_id != -1 || ev->stop_string_len != 0) {
        r->bad_fields++;
      }
      break;
    case WEFT_EVENT_ERROR:
      r->finals++;
      snprintf(r->error, sizeof r->error, "%.*s", (int)ev->message_len, ev->message);
      break;
    default:
      r->bad_fields++;
  }
  pthread_mutex_unlock(&r->mu);

  if (cancel_now) {
    /* cancelling the request being delivered, from its own callback */
    int32_t st = weft_cancel(r->engine, ev->request_id);
    check(st == WEFT_OK, "weft_cancel from inside a callback", weft_status_string(st));
  }
  if (is_final && r->followup != NULL) {
    uint64_t id = 0;
    r->followup_status = submit_row(r->engine, r->followup, &id);
  }
  if (is_final) {
    /* last use of r by the library: signal the waiter */
    pthread_mutex_lock(&r->mu);
    r->completed = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
  }
}

static int submit_row(weft_engine *engine, row *r, uint64_t *id) {
  char *json = request_json(r);
  int32_t st;
  r->engine = engine;
  st = weft_submit(engine, json, on_event, r, &r->out_id);
  free(json);
  if (id != NULL) *id = r->out_id;
  return st;
}

/* Waits (bounded) for the row's final event. Returns 0 on timeout. */
static int wait_final(row *r, int seconds) {
  struct timespec deadline;
  int ok;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += seconds;
  pthread_mutex_lock(&r->mu);
  while (!r->completed) {
    if (pthread_cond_timedwait(&r->cv, &r->mu, &deadline) != 0) break;
  }
  ok = r->completed;
  pthread_mutex_unlock(&r->mu);
  return ok;
}

/* Checks a greedy, EOS-ignoring row against its golden tokens. */
static void check_golden_row(row *r, int index) {
  char what[128], detail[1024];
  int i, same = r->n_got == r->n_expected;
  for (i = 0; same && i < r->n_got; i++) same = r->got[i] == r->expected[i];
  snprintf(what, sizeof what, "row %d", index);
  snprintf(detail, sizeof detail, "got %d tokens (first %d), want %d (first %d); error \"%s\"", r->n_got,
           r->n_got ? r->got[0] : -1, r->n_expected, r->n_expected ? r->expected[0] : -1, r->error);
  check(same, what, detail);
  check(r->finals == 1 && r->last_kind == WEFT_EVENT_DONE, what, "exactly one final event, a DONE");
  check(r->after_final == 0, what, "no event after the final one");
  check(r->finish_reason == WEFT_FINISH_LENGTH, what, "finish reason LENGTH");
  check(r->prompt_tokens == (uint32_t)r->n_prompt, what, "prompt_tokens");
  check(r->completion_tokens == (uint32_t)r->n_expected, what, "completion_tokens");
  check(r->id_mismatch == 0 && r->bad_fields == 0, what, "event fields");
  check(r->n_empty_text == r->n_got, what, "no tokenizer: every TOKEN text is \"\" with length 0");
}

/* ------------------------------------------------------------------------------------------ */
/* Concurrent submitters. */

typedef struct {
  weft_engine *engine;
  row *r;
  pthread_mutex_t *go_mu;
  pthread_cond_t *go_cv;
  int *go;
  uint64_t id;
  int32_t status;
} submitter;

static void *submit_thread(void *arg) {
  submitter *s = (submitter *)arg;
  pthread_mutex_lock(s->go_mu);
  while (!*s->go) pthread_cond_wait(s->go_cv, s->go_mu);
  pthread_mutex_unlock(s->go_mu);
  s->status = submit_row(s->engine, s->r, &s->id);
  if (s->status == WEFT_OK) wait_final(s->r, 600);
  return NULL;
}

static int read_cases(const char *path, row **out) {
  FILE *f = fopen(path, "r");
  row *rows = NULL;
  int n = 0, i, max_tokens, n_prompt;
  if (f == NULL) return -1;
  while (fscanf(f, "%d %d", &max_tokens, &n_prompt) == 2) {
    row *r;
    rows = (row *)realloc(rows, sizeof(row) * (size_t)(n + 1));
    r = &rows[n++];
    row_init(r);
    r->max_tokens = max_tokens;
    r->n_prompt = n_prompt;
    r->prompt = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)(n_prompt > 0 ? n_prompt : 1));
    for (i = 0; i < n_prompt; i++) {
      unsigned v;
      if (fscanf(f, "%u", &v) != 1) goto bad;
      r->prompt[i] = v;
    }
    if (fscanf(f, "%d", &r->n_expected) != 1) goto bad;
    r->expected = (int32_t *)malloc(sizeof(int32_t) * (size_t)(r->n_expected > 0 ? r->n_expected : 1));
    for (i = 0; i < r->n_expected; i++) {
      int v;
      if (fscanf(f, "%d", &v) != 1) goto bad;
      r->expected[i] = v;
    }
  }
  fclose(f);
  *out = rows;
  return n;
bad:
  fclose(f);
  for (i = 0; i < n; i++) row_destroy(&rows[i]);
  free(rows);
  return -1;
}

/* ------------------------------------------------------------------------------------------ */

static void test_versions(void) {
  const char *v = weft_version();
  check(weft_abi_version() == WEFT_ABI_VERSION, "weft_abi_version() == WEFT_ABI_VERSION", NULL);
  check(v != NULL && strlen(v) >= 5 && strchr(v, '.') != NULL, "weft_version", v);
  check(strcmp(weft_status_string(WEFT_OK), "ok") == 0, "weft_status_string(WEFT_OK)", NULL);
  check(strcmp(weft_status_string(12345), "unknown status") == 0, "weft_status_string(unknown)", NULL);
  check(WEFT_ERR_INVALID_ARGUMENT < 0 && WEFT_ERR_MODEL_LOAD < 0 && WEFT_ERR_NOT_FOUND < 0 &&
            WEFT_ERR_CAPACITY < 0 && WEFT_ERR_SHUTDOWN < 0 && WEFT_ERR_INTERNAL < 0 &&
            WEFT_ERR_UNSUPPORTED < 0,
        "error codes are negative", NULL);
  check(weft_last_error() != NULL, "weft_last_error is never NULL", NULL);
}

static void test_engine_new_errors(const char *model_dir) {
  weft_engine *e = (weft_engine *)&e; /* garbage: must be overwritten with NULL */
  char json[4096];
  int32_t st;

  expect_error(weft_engine_new("{}", NULL), WEFT_ERR_INVALID_ARGUMENT, "out_engine is NULL",
               "engine_new: NULL out_engine");
  expect_error(weft_engine_new("{\"model\": ", &e), WEFT_ERR_INVALID_ARGUMENT, "malformed JSON",
               "engine_new: malformed JSON");
  check(e == NULL, "engine_new: *out_engine is NULL after a failure", NULL);
  expect_error(weft_engine_new("[1]", &e), WEFT_ERR_INVALID_ARGUMENT, "must be an object",
               "engine_new: not an object");
  expect_error(weft_engine_new("{\"max_btach\": 4}", &e), WEFT_ERR_INVALID_ARGUMENT, "max_btach",
               "engine_new: unknown field");
  expect_error(weft_engine_new("{\"max_batch\": \"4\"}", &e), WEFT_ERR_INVALID_ARGUMENT,
               "max_batch must be an integer", "engine_new: type error");
  expect_error(weft_engine_new("{\"max_batch\": 0}", &e), WEFT_ERR_INVALID_ARGUMENT, "max_batch",
               "engine_new: max_batch 0");
  expect_error(weft_engine_new("{\"model\": \"/nonexistent/weft-model\"}", &e), WEFT_ERR_MODEL_LOAD,
               "/nonexistent/weft-model", "engine_new: missing model path");
  expect_error(weft_engine_new("{\"model\": \"\xff\xfe\"}", &e), WEFT_ERR_INVALID_ARGUMENT, "UTF-8",
               "engine_new: invalid UTF-8");
  /* a directory that is not a model */
  snprintf(json, sizeof json, "{\"model\": \"%s/..\"}", model_dir);
  expect_error(weft_engine_new(json, &e), WEFT_ERR_MODEL_LOAD, "config.json", "engine_new: not a model dir");
  check(e == NULL, "engine_new: *out_engine stays NULL", NULL);
  expect_error(weft_engine_new("{\"kv_bits\": 7}", &e), WEFT_ERR_INVALID_ARGUMENT, "kv_bits",
               "engine_new: kv_bits 7");
  /* the tiny model's head_dim is 32: the default group of 64 cannot quantize it */
  snprintf(json, sizeof json, "{\"model\": \"%s\", \"kv_bits\": 4}", model_dir);
  expect_error(weft_engine_new(json, &e), WEFT_ERR_INVALID_ARGUMENT, "head_dim", "engine_new: kv_group_size vs head_dim");
  snprintf(json, sizeof json, "{\"model\": \"%s\", \"kv_bits\": 8, \"kv_group_size\": 32}", model_dir);
  st = weft_engine_new(json, &e);
  check(st == WEFT_OK && e != NULL, "engine_new: quantized KV options", weft_last_error());
  weft_engine_free(e);
}

static void test_submit_errors(weft_engine *engine, weft_engine *budget_engine) {
  row r;
  uint64_t id = 777;
  char *big;
  size_t n;
  int i;
  row_init(&r);

  expect_error(weft_submit(NULL, "{\"prompt_ids\": [1]}", on_event, &r, &id), WEFT_ERR_INVALID_ARGUMENT,
               "engine is NULL", "submit: NULL engine");
  expect_error(weft_submit(engine, NULL, on_event, &r, &id), WEFT_ERR_INVALID_ARGUMENT, "request_json is NULL",
               "submit: NULL json");
  expect_error(weft_submit(engine, "{\"prompt_ids\": [1]}", NULL, &r, &id), WEFT_ERR_INVALID_ARGUMENT,
               "on_event is NULL", "submit: NULL callback");
  expect_error(weft_submit(engine, "{\"prompt_ids\": [1,", on_event, &r, &id), WEFT_ERR_INVALID_ARGUMENT,
               "malformed JSON", "submit: malformed JSON");
  expect_error(weft_submit(engine, "{\"prompt_ids\": [1], \"temprature\": 0.5}", on_event, &r, &id),
               WEFT_ERR_INVALID_ARGUMENT, "temprature", "submit: unknown field");
  expect_error(weft_submit(engine, "{\"prompt_ids\": [1], \"max_tokens\": \"8\"}", on_event, &r, &id),
               WEFT_ERR_INVALID_ARGUMENT, "max_tokens must be an integer", "submit: type error (max_tokens)");
  expect_error(weft_submit(engine, "{\"prompt_ids\": \"1 2 3\"}", on_event, &r, &id), WEFT_ERR_INVALID_ARGUMENT,
               "prompt_ids", "submit: type error (prompt_ids)");
  expect_error(weft_submit(engine, "{\"prompt_ids\": [1], \"ignore_eos\": 1}", on_event, &r, &id),
               WEFT_ERR_INVALID_ARGUMENT, "ignore_eos", "submit: type error (ignore_eos)");
  expect_error(weft_submit(engine, "{\"prompt_ids\": [1], \"stop\": 5}", on_event, &r, &id),
               WEFT_ERR_INVALID_ARGUMENT, "stop", "submit: type error (stop)");
  expect_error(weft_submit(engine, "{\"max_tokens\": 4}", on_event, &r, &id), WEFT_ERR_INVALID_ARGUMENT,
               "exactly one of", "submit: no input");
  expect_error(weft_submit(engine, "{\"prompt_ids\": []}", on_event, &r, &id), WEFT_ERR_INVALID_ARGUMENT,
               "empty", "submit: empty prompt");
  expect_error(weft_submit(engine, "{\"prompt_ids\": [1, 1024]}", on_event, &r, &id), WEFT_ERR_INVALID_ARGUMENT,
               "1024", "submit: token id outside the vocabulary");
  expect_error(weft_submit(engine, "{\"prompt_ids\": [1], \"max_tokens\": 0}", on_event, &r, &id),
               WEFT_ERR_INVALID_ARGUMENT, "max_tokens", "submit: max_tokens 0");
  expect_error(weft_submit(engine, "{\"prompt_ids\": [1], \"temperature\": -1}", on_event, &r, &id),
               WEFT_ERR_INVALID_ARGUMENT, "temperature", "submit: negative temperature");
  expect_error(weft_submit(engine, "{\"prompt\": \"hello\"}", on_event, &r, &id), WEFT_ERR_INVALID_ARGUMENT,
               "tokenizer", "submit: text for a model without a tokenizer");
  expect_error(weft_submit(engine, "{\"prompt_ids\": [1], \"prompt\": \"\xc3\x28\"}", on_event, &r, &id),
               WEFT_ERR_INVALID_ARGUMENT, "UTF-8", "submit: invalid UTF-8");

  /* a prompt longer than the model's context (2048) */
  big = (char *)malloc(3000 * 4 + 64);
  n = (size_t)sprintf(big, "{\"prompt_ids\": [");
  for (i = 0; i < 2100; i++) n += (size_t)sprintf(big + n, "%s7", i ? "," : "");
  sprintf(big + n, "]}");
  expect_error(weft_submit(engine, big, on_event, &r, &id), WEFT_ERR_INVALID_ARGUMENT, "context",
               "submit: prompt over context");
  free(big);

  /* a request that alone needs more KV cache than the engine's budget */
  expect_error(weft_submit(budget_engine, "{\"prompt_ids\": [1, 2], \"max_tokens\": 1000}", on_event, &r, &id),
               WEFT_ERR_CAPACITY, "KV budget", "submit: over the KV budget");

  check(id == 777, "submit: *out_request_id untouched on failure", NULL);
  check(r.finals == 0 && r.n_got == 0, "submit: no callback for a failed submit", NULL);

  expect_error(weft_cancel(NULL, 1), WEFT_ERR_INVALID_ARGUMENT, "engine is NULL", "cancel: NULL engine");
  expect_error(weft_cancel(engine, 0), WEFT_ERR_NOT_FOUND, "0", "cancel: id 0");
  expect_error(weft_cancel(engine, 987654321), WEFT_ERR_NOT_FOUND, "987654321", "cancel: unknown id");
  expect_error(weft_engine_stats(NULL, NULL, 0, NULL), WEFT_ERR_INVALID_ARGUMENT, "engine is NULL",
               "stats: NULL engine");
  expect_error(weft_engine_stats(engine, NULL, 10, NULL), WEFT_ERR_INVALID_ARGUMENT, "buf is NULL",
               "stats: NULL buf with cap");
  expect_error(weft_engine_shutdown(NULL), WEFT_ERR_INVALID_ARGUMENT, "engine is NULL", "shutdown: NULL engine");
  weft_engine_free(NULL); /* no-op */
  row_destroy(&r);
}

static void test_stats(weft_engine *engine, int min_finished) {
  size_t len = 0;
  char small[8];
  char *buf;
  int32_t st = weft_engine_stats(engine, NULL, 0, &len);
  const char *p;
  check(st == WEFT_ERR_CAPACITY && len > 20, "stats: size query", weft_last_error());
  st = weft_engine_stats(engine, small, sizeof small, &len);
  check(st == WEFT_ERR_CAPACITY, "stats: small buffer", NULL);
  buf = (char *)malloc(len + 1);
  st = weft_engine_stats(engine, buf, len + 1, &len);
  check(st == WEFT_OK && strlen(buf) == len, "stats: exact buffer", buf);
  p = strstr(buf, "\"requests_finished\":");
  check(p != NULL && atoi(p + strlen("\"requests_finished\":")) >= min_finished, "stats: requests_finished", buf);
  check(strstr(buf, "\"active_rows\":") != NULL && strstr(buf, "\"kv_bytes_in_use\":") != NULL, "stats: fields", buf);
  free(buf);
}

/* A long request cancelled from another thread after its first token. */
static void test_cancel_from_other_thread(weft_engine *engine) {
  row r;
  uint64_t id = 0;
  int i, waited = 0;
  int32_t st;
  row_init(&r);
  r.n_prompt = 3;
  r.prompt = (uint32_t *)malloc(sizeof(uint32_t) * 3);
  r.prompt[0] = 11; r.prompt[1] = 12; r.prompt[2] = 13;
  r.max_tokens = 2000;
  st = submit_row(engine, &r, &id);
  check(st == WEFT_OK && id > 0, "cancel test: submit", weft_last_error());
  for (i = 0; i < 60000 && st == WEFT_OK; i++) {
    int have;
    pthread_mutex_lock(&r.mu);
    have = r.n_got > 0 || r.finals > 0;
    pthread_mutex_unlock(&r.mu);
    if (have) break;
    sleep_ms(1);
    waited++;
  }
  st = weft_cancel(engine, id);
  check(st == WEFT_OK, "cancel from another thread", weft_status_string(st));
  check(wait_final(&r, 600), "cancel test: final event arrives", NULL);
  check(r.finals == 1 && r.finish_reason == WEFT_FINISH_CANCELLED, "cancel from another thread: DONE CANCELLED",
        r.error);
  check(r.n_got >= 1 && r.n_got < 2000 && r.completion_tokens == (uint32_t)r.n_got,
        "cancel from another thread: some tokens, fewer than max_tokens", NULL);
  check(r.event_id == id, "cancel test: event request_id == submitted id", NULL);
  /* a finished id: cancelling again is a no-op */
  check(weft_cancel(engine, id) == WEFT_OK, "cancel of a finished request is WEFT_OK", NULL);
  row_destroy(&r);
}

/* "logprobs" / "top_logprobs": greedy picks the most likely token, so it heads the list. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int tokens, bad, done;
} logprob_state;

static void on_logprob_event(void *user_data, const weft_event *ev) {
  logprob_state *s = (logprob_state *)user_data;
  pthread_mutex_lock(&s->mu);
  if (ev->kind == WEFT_EVENT_TOKEN) {
    s->tokens++;
    if (!(ev->logprob <= 0.0f) || ev->top_logprobs_len != 3 || ev->top_logprobs == NULL ||
        ev->top_logprobs[0].token_id != ev->token_id || ev->top_logprobs[0].logprob != ev->logprob ||
        ev->top_logprobs[1].logprob > ev->top_logprobs[0].logprob ||
        ev->top_logprobs[2].logprob > ev->top_logprobs[1].logprob) {
      s->bad++;
    }
  } else {
    s->done = ev->kind == WEFT_EVENT_DONE ? 1 : -1;
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
}

static void test_logprobs(weft_engine *engine) {
  logprob_state s;
  int32_t st;
  memset(&s, 0, sizeof s);
  pthread_mutex_init(&s.mu, NULL);
  pthread_cond_init(&s.cv, NULL);
  st = weft_submit(engine, "{\"prompt_ids\": [5, 6, 7], \"max_tokens\": 5, \"ignore_eos\": true, "
                           "\"logprobs\": true, \"top_logprobs\": 3}",
                   on_logprob_event, &s, NULL);
  check(st == WEFT_OK, "logprobs: submit", weft_last_error());
  pthread_mutex_lock(&s.mu);
  while (st == WEFT_OK && s.done == 0) pthread_cond_wait(&s.cv, &s.mu);
  pthread_mutex_unlock(&s.mu);
  check(s.done == 1 && s.tokens == 5 && s.bad == 0, "logprobs: logprob, 3 alternatives, best first = the greedy token",
        NULL);
  pthread_mutex_destroy(&s.mu);
  pthread_cond_destroy(&s.cv);
}

/* A callback that blocks holds back only its own request: a twin request (same prompt) runs to
 * completion meanwhile, the blocked row shows up as paused in the stats, and once released it
 * finishes with the twin's tokens. (If callbacks shared the engine's thread, the twin would
 * never finish while the gate is closed.) */
typedef struct {
  row r; /* first member: on_event receives &slow_row as a row */
  pthread_mutex_t gate_mu;
  pthread_cond_t gate_cv;
  int released;
} slow_row;

static void on_slow_event(void *user_data, const weft_event *ev) {
  slow_row *s = (slow_row *)user_data;
  int is_token = ev->kind == WEFT_EVENT_TOKEN;
  on_event(&s->r, ev);
  if (is_token) {
    pthread_mutex_lock(&s->gate_mu);
    while (!s->released) pthread_cond_wait(&s->gate_cv, &s->gate_mu);
    pthread_mutex_unlock(&s->gate_mu);
  }
}

static int stats_field(weft_engine *engine, const char *name) {
  char buf[4096], key[64];
  size_t len = 0;
  const char *p;
  if (weft_engine_stats(engine, buf, sizeof buf, &len) != WEFT_OK) return -1;
  snprintf(key, sizeof key, "\"%s\":", name);
  p = strstr(buf, key);
  return p == NULL ? -1 : atoi(p + strlen(key));
}

static void test_slow_callback(weft_engine *engine) {
  slow_row s;
  row twin;
  char *json;
  int32_t st;
  int i, paused = -1, same = 1;
  memset(&s, 0, sizeof s);
  row_init(&s.r);
  row_init(&twin);
  pthread_mutex_init(&s.gate_mu, NULL);
  pthread_cond_init(&s.gate_cv, NULL);
  s.r.n_prompt = twin.n_prompt = 3;
  s.r.prompt = (uint32_t *)malloc(sizeof(uint32_t) * 3);
  twin.prompt = (uint32_t *)malloc(sizeof(uint32_t) * 3);
  for (i = 0; i < 3; i++) s.r.prompt[i] = twin.prompt[i] = (uint32_t)(21 + i);
  s.r.max_tokens = twin.max_tokens = 150;
  s.r.engine = engine;
  json = request_json(&s.r);
  st = weft_submit(engine, json, on_slow_event, &s, &s.r.out_id);
  free(json);
  check(st == WEFT_OK, "slow callback: submit", weft_last_error());
  st = submit_row(engine, &twin, NULL);
  check(st == WEFT_OK, "slow callback: submit twin", weft_last_error());
  check(wait_final(&twin, 600), "a blocked callback does not hold back another request", NULL);
  for (i = 0; i < 1000 && paused != 1; i++) {
    paused = stats_field(engine, "paused_rows");
    if (paused != 1) sleep_ms(10);
  }
  check(paused == 1, "the blocked request's row is parked (stats paused_rows)", NULL);
  pthread_mutex_lock(&s.r.mu);
  check(s.r.n_got == 1 && s.r.finals == 0, "the blocked callback got one event so far", NULL);
  pthread_mutex_unlock(&s.r.mu);

  pthread_mutex_lock(&s.gate_mu);
  s.released = 1;
  pthread_cond_broadcast(&s.gate_cv);
  pthread_mutex_unlock(&s.gate_mu);
  check(wait_final(&s.r, 600), "the released request finishes", NULL);
  check(s.r.finish_reason == WEFT_FINISH_LENGTH && s.r.n_got == 150 && twin.n_got == 150,
        "slow callback: both rows reach max_tokens", s.r.error);
  for (i = 0; i < s.r.n_got && i < twin.n_got; i++) same = same && s.r.got[i] == twin.got[i];
  check(same, "the parked row continues exactly as its twin", NULL);
  check(stats_field(engine, "paused_rows") == 0, "no row parked afterwards", NULL);
  pthread_mutex_destroy(&s.gate_mu);
  pthread_cond_destroy(&s.gate_cv);
  row_destroy(&s.r);
  row_destroy(&twin);
}

/* A request outstanding when the engine is freed gets its final event before free returns. */
static void test_free_with_outstanding(const char *options) {
  weft_engine *e = NULL;
  row r;
  uint64_t id = 0;
  int32_t st = weft_engine_new(options, &e);
  check(st == WEFT_OK && e != NULL, "second engine", weft_last_error());
  if (st != WEFT_OK) return;
  row_init(&r);
  r.n_prompt = 1;
  r.prompt = (uint32_t *)malloc(sizeof(uint32_t));
  r.prompt[0] = 42;
  r.max_tokens = 2000;
  st = submit_row(e, &r, &id);
  check(st == WEFT_OK, "free test: submit", weft_last_error());
  weft_engine_free(e);
  /* no waiting: free joined the engine thread, so the final event has been delivered */
  check(r.finals == 1 && r.finish_reason == WEFT_FINISH_CANCELLED, "free cancels outstanding requests", r.error);
  row_destroy(&r);
}

int main(int argc, char **argv) {
  const char *model_dir, *cases_path, *mode;
  char options[4096], budget_options[4096];
  weft_engine *engine = NULL, *budget_engine = NULL;
  row *rows = NULL;
  int n_rows, n_use, i;
  int32_t st;

  if (argc != 4) {
    fprintf(stderr, "usage: %s <model_dir> <cases_file> full|quick|version\n", argv[0]);
    return 2;
  }
  model_dir = argv[1];
  cases_path = argv[2];
  mode = argv[3];

  test_versions();
  if (strcmp(mode, "version") == 0) goto done;

  test_engine_new_errors(model_dir);

  n_rows = read_cases(cases_path, &rows);
  if (n_rows <= 0) {
    fprintf(stderr, "cannot read cases from %s\n", cases_path);
    return 2;
  }
  n_use = strcmp(mode, "quick") == 0 ? (n_rows < 3 ? n_rows : 3) : n_rows;

  snprintf(options, sizeof options, "{\"model\": \"%s\", \"max_batch\": 8, \"prefill_step_size\": 2048}", model_dir);
  snprintf(budget_options, sizeof budget_options, "{\"model\": \"%s\", \"kv_budget_bytes\": 500000, \"max_batch\": 2}",
           model_dir);
  st = weft_engine_new(options, &engine);
  check(st == WEFT_OK && engine != NULL, "weft_engine_new", weft_last_error());
  if (st != WEFT_OK) goto done;
  st = weft_engine_new(budget_options, &budget_engine);
  check(st == WEFT_OK && budget_engine != NULL, "weft_engine_new (KV budget)", weft_last_error());
  if (st != WEFT_OK) goto done;

  test_submit_errors(engine, budget_engine);
  weft_engine_free(budget_engine);

  {
    /* Goldens from concurrent threads, plus two extra rows running alongside: one cancels
     * itself from its callback after 3 tokens and then submits a follow-up (case 0 again)
     * from the final callback; one tries to free/shut down the engine from its callback. */
    pthread_t *threads = (pthread_t *)malloc(sizeof(pthread_t) * (size_t)(n_use + 2));
    submitter *subs = (submitter *)calloc((size_t)(n_use + 2), sizeof(submitter));
    pthread_mutex_t go_mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t go_cv = PTHREAD_COND_INITIALIZER;
    int go = 0;
    row self_cancel, free_inside, followup;
    uint64_t seen = 0;

    row_init(&self_cancel);
    row_init(&free_inside);
    row_init(&followup);
    self_cancel.n_prompt = 2;
    self_cancel.prompt = (uint32_t *)malloc(sizeof(uint32_t) * 2);
    self_cancel.prompt[0] = 100; self_cancel.prompt[1] = 200;
    self_cancel.max_tokens = 1500;
    self_cancel.cancel_after = 3;
    self_cancel.followup = &followup;
    followup.max_tokens = rows[0].max_tokens;
    followup.n_prompt = rows[0].n_prompt;
    followup.prompt = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)followup.n_prompt);
    memcpy(followup.prompt, rows[0].prompt, sizeof(uint32_t) * (size_t)followup.n_prompt);
    followup.n_expected = rows[0].n_expected;
    followup.expected = (int32_t *)malloc(sizeof(int32_t) * (size_t)followup.n_expected);
    memcpy(followup.expected, rows[0].expected, sizeof(int32_t) * (size_t)followup.n_expected);
    free_inside.n_prompt = 1;
    free_inside.prompt = (uint32_t *)malloc(sizeof(uint32_t));
    free_inside.prompt[0] = 300;
    free_inside.max_tokens = 4;
    free_inside.try_free_inside = 1;

    for (i = 0; i < n_use + 2; i++) {
      subs[i].engine = engine;
      subs[i].r = i < n_use ? &rows[i] : (i == n_use ? &self_cancel : &free_inside);
      subs[i].go_mu = &go_mu;
      subs[i].go_cv = &go_cv;
      subs[i].go = &go;
      pthread_create(&threads[i], NULL, submit_thread, &subs[i]);
    }
    pthread_mutex_lock(&go_mu);
    go = 1;
    pthread_cond_broadcast(&go_cv);
    pthread_mutex_unlock(&go_mu);
    for (i = 0; i < n_use + 2; i++) pthread_join(threads[i], NULL);

    for (i = 0; i < n_use + 2; i++) {
      char what[64];
      snprintf(what, sizeof what, "submit row %d", i);
      check(subs[i].status == WEFT_OK && subs[i].id > 0, what, weft_status_string(subs[i].status));
      check(subs[i].r->event_id == subs[i].id, what, "events carry the id weft_submit returned");
    }
    for (i = 0; i < n_use; i++) check_golden_row(&rows[i], i);
    /* ids are distinct */
    for (i = 0; i < n_use + 2; i++) {
      int j;
      for (j = i + 1; j < n_use + 2; j++) check(subs[i].id != subs[j].id, "distinct request ids", NULL);
    }

    check(self_cancel.finals == 1 && self_cancel.finish_reason == WEFT_FINISH_CANCELLED,
          "cancel from inside the callback: DONE CANCELLED", self_cancel.error);
    check(self_cancel.n_got >= 3 && self_cancel.n_got < 1500, "cancel from inside the callback: stopped early", NULL);
    check(self_cancel.followup_status == WEFT_OK, "submit from inside a callback",
          weft_status_string(self_cancel.followup_status));
    if (self_cancel.followup_status == WEFT_OK) {
      check(wait_final(&followup, 600), "follow-up finishes", NULL);
      check_golden_row(&followup, -1);
    }
    check(free_inside.free_refused, "weft_engine_free / shutdown refused inside a callback", NULL);
    check(free_inside.finals == 1 && free_inside.finish_reason == WEFT_FINISH_LENGTH && free_inside.n_got == 4,
          "the engine keeps running after a refused free", free_inside.error);
    seen = (uint64_t)(n_use + 3); /* the rows, the two extra ones and the follow-up */

    test_cancel_from_other_thread(engine);
    test_logprobs(engine);
    test_slow_callback(engine);
    test_stats(engine, (int)seen);

    row_destroy(&self_cancel);
    row_destroy(&free_inside);
    row_destroy(&followup);
    free(threads);
    free(subs);
  }

  /* shutdown keeps the handle valid; later calls fail with WEFT_ERR_SHUTDOWN */
  st = weft_engine_shutdown(engine);
  check(st == WEFT_OK, "weft_engine_shutdown", weft_last_error());
  check(weft_engine_shutdown(engine) == WEFT_OK, "weft_engine_shutdown twice", NULL);
  {
    row r;
    uint64_t id = 0;
    row_init(&r);
    expect_error(weft_submit(engine, "{\"prompt_ids\": [1]}", on_event, &r, &id), WEFT_ERR_SHUTDOWN, "shut down",
                 "submit after shutdown");
    expect_error(weft_cancel(engine, 1), WEFT_ERR_SHUTDOWN, "shut down", "cancel after shutdown");
    expect_error(weft_engine_stats(engine, NULL, 0, NULL), WEFT_ERR_SHUTDOWN, "shut down", "stats after shutdown");
    row_destroy(&r);
  }
  weft_engine_free(engine);
  engine = NULL;

  test_free_with_outstanding(options);

done:
  for (i = 0; rows != NULL && i < n_rows; i++) row_destroy(&rows[i]);
  free(rows);
  if (g_failures == 0) {
    printf("PASS %d checks\n", g_checks);
    return 0;
  }
  printf("FAIL %d of %d checks\n", g_failures, g_checks);
  return 1;
}
