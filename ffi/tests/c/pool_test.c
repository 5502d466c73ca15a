/* Many outstanding requests cost a bounded number of threads: 2,000 submits (each a few tokens,
 * callbacks slowed a little so events pile up) are delivered by the engine's small delivery
 * pool, not a thread per request. Every request gets its events in order (its TOKEN count
 * before exactly one DONE equals completion_tokens), and the process's thread count, sampled
 * from /proc/self/task while the requests run, stays within a small bound over its count
 * before the first submit. Prints PASS or FAIL lines.
 *   pool_test <model dir> */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "weft.h"

#define N 2000
/* The pool's threads (8) plus slack for threads MLX or the runtime may start meanwhile. */
#define BOUND 24

typedef struct {
  int tokens, finals, out_of_order, completion;
} row;

static row rows[N];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int finished = 0;

static int threads_now(void) {
  int n = 0;
  struct dirent *e;
  DIR *d = opendir("/proc/self/task");
  if (d == NULL) return -1;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static void on_event(void *user_data, const weft_event *ev) {
  row *r = (row *)user_data;
  struct timespec ts = {0, 200000}; /* 0.2 ms: a callback slower than the engine */
  nanosleep(&ts, NULL);
  pthread_mutex_lock(&mu);
  if (r->finals > 0) r->out_of_order = 1;
  if (ev->kind == WEFT_EVENT_TOKEN) r->tokens++;
  if (ev->kind != WEFT_EVENT_TOKEN) {
    r->finals++;
    r->completion = ev->kind == WEFT_EVENT_DONE ? (int)ev->completion_tokens : -1;
    finished++;
    pthread_cond_broadcast(&cv);
  }
  pthread_mutex_unlock(&mu);
}

static int failures = 0;
static void check(int ok, const char *what) {
  printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) failures++;
}

int main(int argc, char **argv) {
  char options[4096], msg[256];
  weft_engine *engine = NULL;
  int i, base, most = 0, accepted = 0, bad = 0;
  if (argc != 2) {
    fprintf(stderr, "usage: pool_test <model dir>\n");
    return 2;
  }
  snprintf(options, sizeof options, "{\"model\": \"%s\", \"max_batch\": 32}", argv[1]);
  if (weft_engine_new(options, &engine) != WEFT_OK) {
    fprintf(stderr, "weft_engine_new: %s\n", weft_last_error());
    return 1;
  }
  base = threads_now();
  check(base > 0, "/proc/self/task is readable");
  for (i = 0; i < N; i++) {
    char request[128];
    int t;
    snprintf(request, sizeof request, "{\"prompt_ids\": [%d, 7, 9], \"max_tokens\": 3, \"ignore_eos\": true}", i % 50 + 1);
    if (weft_submit(engine, request, on_event, &rows[i], NULL) == WEFT_OK) {
      accepted++;
    } else {
      fprintf(stderr, "submit %d: %s\n", i, weft_last_error());
    }
    t = threads_now();
    if (t > most) most = t;
  }
  check(accepted == N, "every submit is accepted");
  pthread_mutex_lock(&mu);
  while (finished < accepted) {
    pthread_mutex_unlock(&mu);
    i = threads_now();
    if (i > most) most = i;
    pthread_mutex_lock(&mu);
    if (finished < accepted) {
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += 20000000;
      if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
      }
      pthread_cond_timedwait(&cv, &mu, &until);
    }
  }
  pthread_mutex_unlock(&mu);
  for (i = 0; i < N; i++)
    if (rows[i].finals != 1 || rows[i].out_of_order || rows[i].completion != rows[i].tokens) bad++;
  check(bad == 0, "each request: its TOKENs in order, then exactly one DONE counting them");
  snprintf(msg, sizeof msg, "threads stay bounded: at most %d over the %d before submitting (saw %d)", BOUND, base, most);
  check(most - base <= BOUND, msg);
  weft_engine_free(engine);
  printf("%s\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}
