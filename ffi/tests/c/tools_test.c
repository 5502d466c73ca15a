/* Tool calls through the C ABI (weft_event's tool_deltas / tool_calls, ABI minor 1) on a model
 * whose chat template has no tool support (Weft's fallback prompt, Hermes syntax). The choice is
 * forced (a named function, or "required" between two tools), so the output is a call whatever
 * the weights are; each tool's one parameter is an enum, so the call always completes. Checks:
 * DONE has WEFT_FINISH_TOOL_CALLS and the expected call; no TOKEN carries text (a call's text is
 * not leaked); the streamed deltas assemble to DONE's tool_calls (ids, names, arguments); a call
 * max_tokens cuts short is not delivered; a plain request has no tool fields; bad tool requests
 * fail at weft_submit naming the field. Prints PASS or FAIL lines.
 *   tools_test <model> */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "weft.h"

#define MAX_CALLS 4
#define CAP 1024

typedef struct {
  char id[64], name[64], arguments[CAP];
} call;

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t text_len; /* bytes of text over TOKEN and DONE events */
  call streamed[MAX_CALLS];
  int n_streamed;
  call final[MAX_CALLS];
  int n_final;
  int done, finish, stop_kind, bad; /* bad: a malformed delta (wrong order, NULL string, overflow) */
  int deltas_on_plain_token;        /* a TOKEN with tool_deltas_len 0 but a non-NULL pointer */
  size_t args_at_done;              /* argument bytes DONE's own tool_deltas carried */
} row;

static void copy(char *dst, size_t cap, const char *s, size_t n, int *bad) {
  size_t have = strlen(dst);
  if (s == NULL || have + n >= cap) {
    *bad = 1;
    return;
  }
  memcpy(dst + have, s, n);
  dst[have + n] = 0;
}

static void apply(row *r, const weft_tool_delta *d) {
  if (d->kind == WEFT_TOOL_DELTA_START) {
    if ((int)d->index != r->n_streamed || r->n_streamed == MAX_CALLS || d->arguments_len != 0) {
      r->bad = 1;
      return;
    }
    copy(r->streamed[r->n_streamed].id, sizeof r->streamed[0].id, d->id, d->id_len, &r->bad);
    copy(r->streamed[r->n_streamed].name, sizeof r->streamed[0].name, d->name, d->name_len, &r->bad);
    r->n_streamed++;
  } else if (d->kind == WEFT_TOOL_DELTA_ARGUMENTS) {
    if ((int)d->index >= r->n_streamed || d->id_len != 0 || d->name_len != 0) {
      r->bad = 1;
      return;
    }
    copy(r->streamed[d->index].arguments, CAP, d->arguments, d->arguments_len, &r->bad);
  } else {
    r->bad = 1;
  }
}

static void on_event(void *user_data, const weft_event *ev) {
  row *r = (row *)user_data;
  size_t i;
  pthread_mutex_lock(&r->mu);
  if (ev->kind == WEFT_EVENT_TOKEN || ev->kind == WEFT_EVENT_DONE) {
    r->text_len += ev->text_len;
    if (ev->tool_deltas_len == 0 && ev->tool_deltas != NULL) r->deltas_on_plain_token = 1;
    for (i = 0; i < ev->tool_deltas_len; i++) apply(r, &ev->tool_deltas[i]);
  }
  if (ev->kind == WEFT_EVENT_TOKEN && ev->tool_calls_len != 0) r->bad = 1;
  if (ev->kind == WEFT_EVENT_DONE) {
    for (i = 0; i < ev->tool_deltas_len; i++)
      if (ev->tool_deltas[i].kind == WEFT_TOOL_DELTA_ARGUMENTS) r->args_at_done += ev->tool_deltas[i].arguments_len;
    r->finish = ev->finish_reason;
    r->stop_kind = ev->stop_kind;
    if (ev->tool_calls_len > MAX_CALLS || (ev->tool_calls_len == 0) != (ev->tool_calls == NULL)) r->bad = 1;
    for (i = 0; i < ev->tool_calls_len && i < MAX_CALLS; i++) {
      const weft_tool_call *c = &ev->tool_calls[i];
      copy(r->final[i].id, sizeof r->final[0].id, c->id, c->id_len, &r->bad);
      copy(r->final[i].name, sizeof r->final[0].name, c->name, c->name_len, &r->bad);
      copy(r->final[i].arguments, CAP, c->arguments, c->arguments_len, &r->bad);
    }
    r->n_final = (int)(ev->tool_calls_len < MAX_CALLS ? ev->tool_calls_len : MAX_CALLS);
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

/* The streamed deltas assembled to exactly DONE's calls. */
static int assembles(const row *r) {
  int i;
  if (r->bad || r->n_streamed != r->n_final) return 0;
  for (i = 0; i < r->n_final; i++) {
    if (strcmp(r->streamed[i].id, r->final[i].id) || strcmp(r->streamed[i].name, r->final[i].name) ||
        strcmp(r->streamed[i].arguments, r->final[i].arguments))
      return 0;
  }
  return 1;
}

/* `json` without spaces. */
static void squeeze(const char *json, char *out, size_t cap) {
  size_t n = 0;
  for (; *json && n + 1 < cap; json++)
    if (*json != ' ' && *json != '\n') out[n++] = *json;
  out[n] = 0;
}

static int args_are(const char *arguments, const char *a, const char *b) {
  char s[CAP];
  squeeze(arguments, s, sizeof s);
  return strcmp(s, a) == 0 || strcmp(s, b) == 0;
}

#define WEATHER                                                                                               \
  "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in a unit\", " \
  "\"parameters\": {\"type\": \"object\", \"properties\": {\"unit\": {\"enum\": [\"c\", \"f\"]}}, "          \
  "\"required\": [\"unit\"], \"additionalProperties\": false}}}"
#define CLOCK                                                                                                 \
  "{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": \"object\", "   \
  "\"properties\": {\"tz\": {\"enum\": [\"utc\", \"cet\"]}}, \"required\": [\"tz\"], "                        \
  "\"additionalProperties\": false}}}"
#define ASK "\"messages\": [{\"role\": \"user\", \"content\": \"What is the weather in Oslo?\"}]"

int main(int argc, char **argv) {
  char options[4096];
  weft_engine *engine = NULL;
  row r;
  if (argc != 2) {
    fprintf(stderr, "usage: tools_test <model>\n");
    return 2;
  }
  check(weft_abi_minor() == WEFT_ABI_MINOR && WEFT_ABI_MINOR >= 1, "weft_abi_minor() is the header's, >= 1", NULL);
  snprintf(options, sizeof options, "{\"model\": \"%s\"}", argv[1]);
  if (weft_engine_new(options, &engine) != WEFT_OK) {
    fprintf(stderr, "weft_engine_new: %s\n", weft_last_error());
    return 1;
  }

  /* A named function. */
  check(run(engine,
            "{" ASK ", \"max_tokens\": 40, \"tools\": [" WEATHER "], "
            "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}}",
            &r) == 0,
        "named tool_choice accepted", weft_last_error());
  check(r.done == 1 && r.finish == WEFT_FINISH_TOOL_CALLS, "named: DONE with WEFT_FINISH_TOOL_CALLS", NULL);
  check(r.stop_kind == WEFT_STOP_NONE || r.stop_kind == WEFT_STOP_CONSTRAINT || r.stop_kind == WEFT_STOP_EOS,
        "named: stop_kind is none (the call ended it), the constraint or EOS", NULL);
  check(r.n_final == 1 && strcmp(r.final[0].name, "get_weather") == 0, "named: one call of get_weather", r.final[0].name);
  check(strncmp(r.final[0].id, "call_", 5) == 0 && strlen(r.final[0].id) == 29, "named: the id is call_ + 24", r.final[0].id);
  check(args_are(r.final[0].arguments, "{\"unit\":\"c\"}", "{\"unit\":\"f\"}"), "named: arguments match the schema",
        r.final[0].arguments);
  check(assembles(&r), "named: the deltas assemble to the final calls", r.streamed[0].arguments);
  check(r.text_len == 0 && !r.deltas_on_plain_token, "named: no text leaked, tool_deltas NULL when empty", NULL);

  /* "required" between two tools. */
  check(run(engine, "{" ASK ", \"max_tokens\": 40, \"tools\": [" WEATHER ", " CLOCK "], \"tool_choice\": \"required\", \"parallel_tool_calls\": false}", &r) == 0,
        "required tool_choice accepted", weft_last_error());
  check(r.done == 1 && r.finish == WEFT_FINISH_TOOL_CALLS && r.n_final >= 1, "required: DONE with calls", NULL);
  check((strcmp(r.final[0].name, "get_weather") == 0 &&
         args_are(r.final[0].arguments, "{\"unit\":\"c\"}", "{\"unit\":\"f\"}")) ||
            (strcmp(r.final[0].name, "get_time") == 0 &&
             args_are(r.final[0].arguments, "{\"tz\":\"utc\"}", "{\"tz\":\"cet\"}")),
        "required: a call of one of the tools, arguments valid for it", r.final[0].arguments);
  check(assembles(&r) && r.text_len == 0, "required: the deltas assemble to the final calls, no text", NULL);

  /* Arguments that complete only at the end: the stop string holds back the call's tail ("}}
   * and the closing tag are a prefix of it) until the constraint ends the row, so DONE itself
   * carries the last argument piece; the deltas still assemble to DONE's calls. */
  check(run(engine,
            "{" ASK ", \"max_tokens\": 40, \"tools\": [" WEATHER "], "
            "\"stop\": [\"\\\"}}\\n</tool_call>!\"], "
            "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}}",
            &r) == 0,
        "held-back named request accepted", weft_last_error());
  check(r.done == 1 && r.finish == WEFT_FINISH_TOOL_CALLS && r.n_final == 1, "held back: DONE with the call", NULL);
  check(r.args_at_done > 0, "held back: DONE's own tool_deltas carry the last argument piece", NULL);
  check(assembles(&r), "held back: the deltas (DONE's included) assemble to the final arguments", r.streamed[0].arguments);

  /* max_tokens inside the call: length, and the cut call is not delivered, not even in part. */
  check(run(engine,
            "{" ASK ", \"max_tokens\": 2, \"tools\": [" WEATHER "], "
            "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}}",
            &r) == 0,
        "short named request accepted", weft_last_error());
  check(r.done == 1 && r.finish == WEFT_FINISH_LENGTH, "short: WEFT_FINISH_LENGTH", NULL);
  check(assembles(&r) && r.n_final == 0 && r.n_streamed == 0, "short: no call, no delta", NULL);

  /* Without tools the tool fields are empty. */
  check(run(engine, "{" ASK ", \"max_tokens\": 4}", &r) == 0, "plain request accepted", weft_last_error());
  check(r.done == 1 && r.n_streamed == 0 && r.n_final == 0 && !r.bad && !r.deltas_on_plain_token,
        "plain: no tool deltas or calls", NULL);
  check(r.finish == WEFT_FINISH_STOP || r.finish == WEFT_FINISH_LENGTH, "plain: an ordinary finish", NULL);

  /* Bad tool requests fail at submit, naming the field. */
  check(run(engine,
            "{" ASK ", \"tools\": [" WEATHER "], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"nosuch\"}}}",
            &r) == -1,
        "an unknown tool in tool_choice is refused", NULL);
  check(strstr(weft_last_error(), "tool_choice") != NULL, "the message names tool_choice", weft_last_error());
  check(run(engine, "{\"prompt\": \"hi\", \"tools\": [" WEATHER "]}", &r) == -1, "tools with a raw prompt are refused", NULL);
  check(strstr(weft_last_error(), "tools") != NULL, "the message names tools", weft_last_error());
  check(run(engine, "{" ASK ", \"tools\": [" WEATHER "], \"tool_choice\": \"required\", \"regex\": \"a\"}", &r) == -1,
        "a forced call with a constraint is refused", NULL);

  weft_engine_free(engine);
  printf("%s\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}
