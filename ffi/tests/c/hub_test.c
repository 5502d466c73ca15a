/*
 * Hugging Face repo ids through the C ABI, driven by tests/c_abi.rs against its local Hub
 * (HF_ENDPOINT and HF_HUB_CACHE are set by the test). Compiles as C99 and as C++.
 *
 *   hub_test <repo id>
 *
 * 1. weft_engine_new_with_progress with a callback that cancels at the first DOWNLOADING
 *    report: WEFT_ERR_CANCELLED, and the message says so.
 * 2. The same with a callback that counts: WEFT_OK, DOWNLOADING reports that never go past
 *    their total, DONE last; a request on the engine finishes.
 * 3. weft_engine_new with the same repo id: WEFT_OK (from the cache).
 * 4. An unknown repo: WEFT_ERR_MODEL_LOAD naming it.
 * Prints one line per failed check and "PASS <n> checks" or "FAIL <k> of <n> checks".
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "weft.h"

static int g_checks = 0;
static int g_failures = 0;

static void check(int ok, const char *what, const char *detail) {
  g_checks++;
  if (!ok) {
    g_failures++;
    fprintf(stderr, "FAILED: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  }
}

typedef struct {
  int reports;
  int downloading;
  int overshoot;
  int last_phase;
  int cancel_at_download;
} progress_log;

static int32_t on_progress(void *user_data, const weft_download_progress *p) {
  progress_log *log = (progress_log *)user_data;
  log->reports++;
  log->last_phase = p->phase;
  if (p->phase == WEFT_DOWNLOAD_DOWNLOADING) {
    log->downloading++;
    if (p->total != 0 && p->downloaded > p->total) log->overshoot++;
    if (log->cancel_at_download) return 1;
  }
  return 0;
}

static void on_event(void *user_data, const weft_event *ev) {
  if (ev->kind != WEFT_EVENT_TOKEN) *(volatile int *)user_data = ev->kind;
}

int main(int argc, char **argv) {
  char options[512], detail[1024];
  weft_engine *engine = NULL;
  progress_log log;
  int32_t st;
  if (argc != 2) {
    fprintf(stderr, "usage: hub_test <repo id>\n");
    return 2;
  }
  check(weft_abi_minor() >= 2, "ABI minor 2 (downloads)", NULL);
  snprintf(options, sizeof options, "{\"model\": \"%s\"}", argv[1]);

  memset(&log, 0, sizeof log);
  log.cancel_at_download = 1;
  st = weft_engine_new_with_progress(options, on_progress, &log, &engine);
  snprintf(detail, sizeof detail, "status %d, message \"%s\"", (int)st, weft_last_error());
  check(st == WEFT_ERR_CANCELLED, "a callback returning non-zero cancels", detail);
  check(strstr(weft_last_error(), "cancel") != NULL, "the message says cancelled", detail);
  check(engine == NULL, "no engine after a cancel", NULL);
  check(log.downloading == 1, "no report after the cancel", NULL);
  check(strcmp(weft_status_string(WEFT_ERR_CANCELLED), "cancelled") == 0, "status string", NULL);

  memset(&log, 0, sizeof log);
  st = weft_engine_new_with_progress(options, on_progress, &log, &engine);
  snprintf(detail, sizeof detail, "status %d, message \"%s\"", (int)st, weft_last_error());
  check(st == WEFT_OK && engine != NULL, "the download resumes and loads", detail);
  check(log.downloading > 0, "DOWNLOADING reported", NULL);
  check(log.overshoot == 0, "downloaded never passes total", NULL);
  check(log.last_phase == WEFT_DOWNLOAD_DONE, "DONE last", NULL);
  if (engine != NULL) {
    volatile int done = 0;
    uint64_t id = 0;
    st = weft_submit(engine, "{\"prompt_ids\": [5, 17, 3], \"max_tokens\": 2, \"temperature\": 0}", on_event,
                     (void *)&done, &id);
    check(st == WEFT_OK, "submit", weft_last_error());
    weft_engine_free(engine); /* waits for the request's last event */
    check(done == WEFT_EVENT_DONE, "the request finished", NULL);
    engine = NULL;
  }

  st = weft_engine_new(options, &engine);
  check(st == WEFT_OK && engine != NULL, "weft_engine_new takes the repo id (cached)", weft_last_error());
  weft_engine_free(engine);
  engine = NULL;

  st = weft_engine_new_with_progress("{\"model\": \"org/no-such-repo\"}", NULL, NULL, &engine);
  snprintf(detail, sizeof detail, "status %d, message \"%s\"", (int)st, weft_last_error());
  check(st == WEFT_ERR_MODEL_LOAD, "an unknown repo is a model load error", detail);
  check(strstr(weft_last_error(), "no repository org/no-such-repo") != NULL, "the message names the repo", detail);

  if (g_failures == 0) {
    printf("PASS %d checks\n", g_checks);
    return 0;
  }
  printf("FAIL %d of %d checks\n", g_failures, g_checks);
  return 1;
}
