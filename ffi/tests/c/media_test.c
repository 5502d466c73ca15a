/* Audio through the C ABI's request contract ("audio": file paths, data: URLs) on the tiny
 * Gemma 4 audio model: the greedy tokens equal mlx-vlm's (the expected ids come from
 * goldens/audio_engine.json via tests/c_abi.rs), the two requests run concurrently, and bad
 * audio fails at weft_submit with WEFT_ERR_INVALID_ARGUMENT naming audio[0]. Prints PASS or
 * FAIL lines.
 *   media_test <model> <clip path> <tokens a,b,...> <clip data: URL> <tokens a,b,...> */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "weft.h"

#define MAX_TOKENS 64

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int tokens[MAX_TOKENS];
  int n, done, error;
} row;

static void on_event(void *user_data, const weft_event *ev) {
  row *r = (row *)user_data;
  pthread_mutex_lock(&r->mu);
  if (ev->kind == WEFT_EVENT_TOKEN && r->n < MAX_TOKENS) r->tokens[r->n++] = ev->token_id;
  if (ev->kind == WEFT_EVENT_ERROR) r->error = 1;
  if (ev->kind == WEFT_EVENT_DONE || ev->kind == WEFT_EVENT_ERROR) {
    r->done = 1;
    pthread_cond_signal(&r->cv);
  }
  pthread_mutex_unlock(&r->mu);
}

static int failures = 0;

static void check(int ok, const char *what) {
  printf("%s %s\n", ok ? "PASS" : "FAIL", what);
  if (!ok) failures++;
}

static int parse_tokens(const char *list, int *out) {
  int n = 0;
  const char *p = list;
  while (*p && n < MAX_TOKENS) {
    out[n++] = (int)strtol(p, (char **)&p, 10);
    if (*p == ',') p++;
  }
  return n;
}

/* {"prompt_ids": [2, 10, 250, 11, 12], "audio": [<source>], ...} */
static char *request(const char *source) {
  const char *fmt = "{\"prompt_ids\": [2, 10, 250, 11, 12], \"max_tokens\": 16, \"ignore_eos\": true, \"audio\": [\"%s\"]}";
  size_t cap = strlen(fmt) + strlen(source) + 1;
  char *text = malloc(cap);
  snprintf(text, cap, fmt, source);
  return text;
}

int main(int argc, char **argv) {
  weft_engine *engine = NULL;
  char options[4096];
  row rows[2];
  const char *sources[2];
  int want[2][MAX_TOKENS], n_want[2], i, k;
  if (argc != 6) {
    fprintf(stderr, "usage: media_test <model> <clip path> <tokens> <clip data: URL> <tokens>\n");
    return 2;
  }
  snprintf(options, sizeof options, "{\"model\": \"%s\"}", argv[1]);
  if (weft_engine_new(options, &engine) != WEFT_OK) {
    fprintf(stderr, "weft_engine_new: %s\n", weft_last_error());
    return 1;
  }
  sources[0] = argv[2];
  sources[1] = argv[4];
  n_want[0] = parse_tokens(argv[3], want[0]);
  n_want[1] = parse_tokens(argv[5], want[1]);
  for (i = 0; i < 2; i++) {
    char *text = request(sources[i]);
    memset(&rows[i], 0, sizeof rows[i]);
    pthread_mutex_init(&rows[i].mu, NULL);
    pthread_cond_init(&rows[i].cv, NULL);
    check(weft_submit(engine, text, on_event, &rows[i], NULL) == WEFT_OK, i == 0 ? "submit: audio as a file path" : "submit: audio as a data: URL");
    free(text);
  }
  for (i = 0; i < 2; i++) {
    int same;
    pthread_mutex_lock(&rows[i].mu);
    while (!rows[i].done) pthread_cond_wait(&rows[i].cv, &rows[i].mu);
    pthread_mutex_unlock(&rows[i].mu);
    same = !rows[i].error && rows[i].n == n_want[i];
    for (k = 0; same && k < n_want[i]; k++) same = rows[i].tokens[k] == want[i][k];
    check(same, i == 0 ? "tokens of the path clip equal mlx-vlm's" : "tokens of the data: URL clip equal mlx-vlm's");
  }
  {
    char *text = request("data:audio/wav;base64,bm90IGF1ZGlvIGF0IGFsbCwganVzdCBzb21lIGJ5dGVz");
    row r;
    memset(&r, 0, sizeof r);
    check(weft_submit(engine, text, on_event, &r, NULL) == WEFT_ERR_INVALID_ARGUMENT, "undecodable audio is WEFT_ERR_INVALID_ARGUMENT");
    check(strstr(weft_last_error(), "audio[0]") != NULL, "its message names audio[0]");
    free(text);
  }
  weft_engine_free(engine);
  printf("%s\n", failures ? "FAIL media_test" : "PASS media_test");
  return failures ? 1 : 0;
}
