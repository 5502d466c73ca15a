/* Reasoning through the C ABI (weft_event's reasoning / reasoning_tokens, ABI minor 2) on a tiny
 * Qwen3.5 with the real Qwen3 vocabulary and Qwen3.5 template: with thinking on the prompt
 * leaves the model in its <think> block, so a random model's output is all reasoning; a budget
 * closes the block after `budget` tokens (plus the forced closing marker, `forced` tokens) and
 * the answer follows as text; with enable_thinking false there is no reasoning. Prints PASS or
 * FAIL lines.
 *   reasoning_test <model dir> <budget> <forced> */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "weft.h"

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t text_len, reasoning_len;
  int tokens, reasoning_tokens, completion_tokens, done, bad;
  int answer_before_reasoning_ended; /* a TOKEN with text, then one with reasoning */
} row;

static void on_event(void *user_data, const weft_event *ev) {
  row *r = (row *)user_data;
  pthread_mutex_lock(&r->mu);
  if (ev->reasoning == NULL || ev->text == NULL) r->bad = 1;
  if (ev->kind == WEFT_EVENT_TOKEN) {
    r->tokens++;
    if (ev->reasoning_len > 0 && r->text_len > 0) r->answer_before_reasoning_ended = 1;
    r->text_len += ev->text_len;
    r->reasoning_len += ev->reasoning_len;
    if (ev->reasoning_tokens != 0) r->bad = 1;
  } else if (ev->kind == WEFT_EVENT_DONE) {
    r->text_len += ev->text_len;
    r->reasoning_len += ev->reasoning_len;
    r->reasoning_tokens = (int)ev->reasoning_tokens;
    r->completion_tokens = (int)ev->completion_tokens;
  }
  if (ev->kind != WEFT_EVENT_TOKEN) {
    r->done = ev->kind == WEFT_EVENT_DONE ? 1 : -1;
    pthread_cond_broadcast(&r->cv);
  }
  pthread_mutex_unlock(&r->mu);
}

static int failures = 0;
static void check(int ok, const char *what) {
  printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) failures++;
}

static void run(weft_engine *engine, const char *request, row *r) {
  uint64_t id;
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  if (weft_submit(engine, request, on_event, r, &id) != WEFT_OK) {
    printf("FAIL weft_submit: %s\n", weft_last_error());
    failures++;
    return;
  }
  pthread_mutex_lock(&r->mu);
  while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
  pthread_mutex_unlock(&r->mu);
}

#define ASK "\"messages\": [{\"role\": \"user\", \"content\": \"Why is the sky blue?\"}], \"temperature\": 0"

int main(int argc, char **argv) {
  char options[4096], request[1024];
  weft_engine *engine = NULL;
  row r;
  int budget, forced;
  if (argc != 4) {
    fprintf(stderr, "usage: reasoning_test <model dir> <budget> <forced>\n");
    return 2;
  }
  budget = atoi(argv[2]);
  forced = atoi(argv[3]);
  check(weft_abi_minor() >= 2, "weft_abi_minor() >= 2 (reasoning fields)");
  snprintf(options, sizeof options, "{\"model\": \"%s\"}", argv[1]);
  if (weft_engine_new(options, &engine) != WEFT_OK) {
    fprintf(stderr, "weft_engine_new: %s\n", weft_last_error());
    return 1;
  }

  run(engine, "{" ASK ", \"max_tokens\": 8}", &r);
  check(r.done == 1 && !r.bad, "thinking on: DONE, strings never NULL");
  check(r.text_len == 0 && r.reasoning_len > 0, "thinking on: all reasoning, no answer text");
  check(r.reasoning_tokens == r.completion_tokens && r.completion_tokens == 8, "thinking on: every token was reasoning");

  snprintf(request, sizeof request, "{" ASK ", \"max_tokens\": 16, \"reasoning_budget\": %d}", budget);
  run(engine, request, &r);
  check(r.done == 1 && !r.bad, "budget: DONE");
  check(r.reasoning_tokens == budget + forced, "budget: reasoning_tokens is the budget and the forced close");
  check(r.reasoning_len > 0 && !r.answer_before_reasoning_ended, "budget: reasoning first, then the answer");

  run(engine, "{" ASK ", \"max_tokens\": 6, \"chat_template_kwargs\": {\"enable_thinking\": false}}", &r);
  check(r.done == 1 && r.reasoning_len == 0 && r.reasoning_tokens == 0, "thinking off: no reasoning");

  weft_engine_free(engine);
  printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
