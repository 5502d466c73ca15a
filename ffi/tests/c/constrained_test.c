/* Constrained output through the C ABI on a tiny GGUF model with an embedded tokenizer (random
 * weights: the output is valid only because the constraint works): response_format json_schema,
 * regex and choice requests end with WEFT_FINISH_STOP and matching text; a bad schema and two
 * constraints at once are refused by weft_submit with WEFT_ERR_INVALID_ARGUMENT naming the field.
 * Prints PASS or FAIL lines.
 *   constrained_test <model.gguf> */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "weft.h"

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  char text[4096];
  size_t len;
  int done, finish, stop_kind;
} row;

static void append(row *r, const char *s, size_t n) {
  if (r->len + n < sizeof r->text) {
    memcpy(r->text + r->len, s, n);
    r->len += n;
    r->text[r->len] = 0;
  }
}

static void on_event(void *user_data, const weft_event *ev) {
  row *r = (row *)user_data;
  pthread_mutex_lock(&r->mu);
  if (ev->kind == WEFT_EVENT_TOKEN) append(r, ev->text, ev->text_len);
  if (ev->kind == WEFT_EVENT_DONE) {
    append(r, ev->text, ev->text_len);
    r->finish = ev->finish_reason;
    r->stop_kind = ev->stop_kind;
  }
  if (ev->kind != WEFT_EVENT_TOKEN) {
    r->done = ev->kind == WEFT_EVENT_DONE ? 1 : -1;
    pthread_cond_broadcast(&r->cv);
  }
  pthread_mutex_unlock(&r->mu);
}

static int failures = 0;
static void check(int ok, const char *what, const char *detail) {
  printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what, detail ? ": " : "", detail ? detail : "");
  if (!ok) failures++;
}

/* Runs `request` to the end; returns 0 if it was accepted. */
static int run(weft_engine *engine, const char *request, row *r) {
  uint64_t id;
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  if (weft_submit(engine, request, on_event, r, &id) != WEFT_OK) return -1;
  pthread_mutex_lock(&r->mu);
  while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
  pthread_mutex_unlock(&r->mu);
  return 0;
}

static int complete(const row *r) {
  return r->done == 1 && r->finish == WEFT_FINISH_STOP && (r->stop_kind == WEFT_STOP_CONSTRAINT || r->stop_kind == WEFT_STOP_EOS);
}

int main(int argc, char **argv) {
  char options[4096];
  weft_engine *engine = NULL;
  row r;
  size_t i;
  int digits = 1;
  if (argc != 2) {
    fprintf(stderr, "usage: constrained_test <model.gguf>\n");
    return 2;
  }
  snprintf(options, sizeof options, "{\"model\": \"%s\"}", argv[1]);
  if (weft_engine_new(options, &engine) != WEFT_OK) {
    fprintf(stderr, "weft_engine_new: %s\n", weft_last_error());
    return 1;
  }
  check(run(engine,
            "{\"prompt\": \"The sea\", \"max_tokens\": 60, \"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
            "{\"name\": \"n\", \"strict\": true, \"schema\": {\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\", "
            "\"minimum\": 10, \"maximum\": 99}}, \"required\": [\"n\"], \"additionalProperties\": false}}}}",
            &r) == 0,
        "json_schema request accepted", weft_last_error());
  check(complete(&r), "json_schema: finished with the structure complete", r.text);
  check(r.len == 8 && strncmp(r.text, "{\"n\":", 5) == 0 && r.text[5] >= '1' && r.text[5] <= '9' && r.text[6] >= '0' &&
            r.text[6] <= '9' && r.text[7] == '}',
        "json_schema: the text is {\"n\":<10..99>}", r.text);

  check(run(engine, "{\"prompt\": \"The sea\", \"max_tokens\": 20, \"regex\": \"[0-9]{4}\"}", &r) == 0, "regex request accepted",
        weft_last_error());
  for (i = 0; i < r.len; i++) digits &= r.text[i] >= '0' && r.text[i] <= '9';
  check(complete(&r) && r.len == 4 && digits, "regex: four digits, then stop", r.text);

  check(run(engine, "{\"prompt\": \"The sea\", \"max_tokens\": 20, \"choice\": [\"calm\", \"rough\"]}", &r) == 0,
        "choice request accepted", weft_last_error());
  check(complete(&r) && (strcmp(r.text, "calm") == 0 || strcmp(r.text, "rough") == 0), "choice: one of the strings", r.text);

  check(run(engine, "{\"prompt\": \"a\", \"json_schema\": {\"type\": \"nosuch\"}}", &r) == -1, "a bad schema is refused at submit", NULL);
  check(strstr(weft_last_error(), "json_schema") != NULL, "the message names json_schema", weft_last_error());
  check(run(engine, "{\"prompt\": \"a\", \"regex\": \"a\", \"choice\": [\"b\"]}", &r) == -1, "two constraints are refused", NULL);
  check(strstr(weft_last_error(), "at most one of") != NULL, "the message says at most one", weft_last_error());
  weft_engine_free(engine);
  printf("%s\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}
