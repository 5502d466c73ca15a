/* The final-event guarantee from C when the engine's thread dies: run with
 * WEFT_FAULTS=driver-panic@6 (tests/c_abi.rs does). Every request, running or queued, gets
 * exactly one final event (an ERROR), weft_engine_health and later weft_submit calls return
 * WEFT_ERR_ENGINE_FAILED, and freeing the dead engine returns. Prints PASS or FAIL lines.
 *   fault_test <model dir> */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "weft.h"

#define ROWS 4

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int finals, errors, after_final;
} row;

static void on_event(void *user_data, const weft_event *ev) {
  row *r = (row *)user_data;
  pthread_mutex_lock(&r->mu);
  if (r->finals > 0) r->after_final++;
  if (ev->kind != WEFT_EVENT_TOKEN) {
    r->finals++;
    if (ev->kind == WEFT_EVENT_ERROR && strstr(ev->message, "engine thread failed") != NULL) r->errors++;
    pthread_cond_broadcast(&r->cv);
  }
  pthread_mutex_unlock(&r->mu);
}

static int failures = 0;
static void check(int ok, const char *what) {
  printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) failures++;
}

int main(int argc, char **argv) {
  char options[4096];
  weft_engine *engine = NULL;
  row rows[ROWS];
  int accepted[ROWS];
  uint64_t id = 0;
  int i, st, n_accepted = 0;
  if (argc != 2) {
    fprintf(stderr, "usage: fault_test <model dir>\n");
    return 2;
  }
  snprintf(options, sizeof options, "{\"model\": \"%s\", \"max_batch\": 2}", argv[1]);
  if (weft_engine_new(options, &engine) != WEFT_OK) {
    fprintf(stderr, "weft_engine_new: %s\n", weft_last_error());
    return 1;
  }
  check(weft_engine_health(engine) == WEFT_OK, "a new engine is healthy");
  for (i = 0; i < ROWS; i++) {
    char request[256];
    memset(&rows[i], 0, sizeof rows[i]);
    pthread_mutex_init(&rows[i].mu, NULL);
    pthread_cond_init(&rows[i].cv, NULL);
    snprintf(request, sizeof request, "{\"prompt_ids\": [%d, 7, 9], \"max_tokens\": 64, \"ignore_eos\": true}", i + 1);
    /* Normally all four are accepted (two run, two wait); on a starved machine the engine may
     * die before the last submits, which must then fail with WEFT_ERR_ENGINE_FAILED. */
    st = weft_submit(engine, request, on_event, &rows[i], &id);
    accepted[i] = st == WEFT_OK;
    n_accepted += accepted[i];
    check(st == WEFT_OK || st == WEFT_ERR_ENGINE_FAILED, "submit: accepted, or refused because the engine failed");
  }
  check(n_accepted >= 1, "at least one request was accepted before the engine thread died");
  for (i = 0; i < ROWS; i++) {
    if (!accepted[i]) continue;
    pthread_mutex_lock(&rows[i].mu);
    while (rows[i].finals == 0) pthread_cond_wait(&rows[i].cv, &rows[i].mu);
    pthread_mutex_unlock(&rows[i].mu);
  }
  for (i = 0; i < ROWS; i++) {
    if (!accepted[i]) continue;
    check(rows[i].finals == 1 && rows[i].after_final == 0, "exactly one final event per request");
    check(rows[i].errors == 1, "the final event is an ERROR naming the failed engine thread");
  }
  st = weft_engine_health(engine);
  check(st == WEFT_ERR_ENGINE_FAILED, "weft_engine_health reports WEFT_ERR_ENGINE_FAILED");
  check(strstr(weft_last_error(), "injected fault") != NULL, "weft_last_error says why");
  st = weft_submit(engine, "{\"prompt_ids\": [1, 2]}", on_event, &rows[0], &id);
  check(st == WEFT_ERR_ENGINE_FAILED, "weft_submit on a failed engine returns WEFT_ERR_ENGINE_FAILED");
  weft_engine_free(engine);
  check(1, "weft_engine_free of a failed engine returns");
  printf("%s\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}
