/* Prompt-cache entries through the C ABI (weft_prompt_cache_save / _load, ABI minor 3): a
 * conversation run on one engine is saved to a file; a new engine loads it and the same
 * request reuses it (cached_tokens > 0) with the same tokens as the first, cold run. A save
 * keyed by a prompt saves that prompt's cached prefix. Missing, corrupt and other-model files,
 * and a cache that is off, are refused with their status. Prints ok / FAIL lines, then PASS.
 *   prompt_cache_test <model dir> <another model dir> <work dir> */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "weft.h"

#define MAX_TOKENS 6

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int tokens[MAX_TOKENS];
  int n, done;
  unsigned cached, prompt;
} row;

static void on_event(void *user_data, const weft_event *ev) {
  row *r = (row *)user_data;
  pthread_mutex_lock(&r->mu);
  if (ev->kind == WEFT_EVENT_TOKEN && r->n < MAX_TOKENS) {
    r->tokens[r->n++] = ev->token_id;
  } else if (ev->kind == WEFT_EVENT_DONE) {
    r->cached = ev->cached_tokens;
    r->prompt = ev->prompt_tokens;
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

static weft_engine *open_engine(const char *model, const char *extra) {
  char options[4096];
  weft_engine *engine = NULL;
  snprintf(options, sizeof options, "{\"model\": \"%s\"%s}", model, extra);
  if (weft_engine_new(options, &engine) != WEFT_OK) {
    fprintf(stderr, "weft_engine_new: %s\n", weft_last_error());
    exit(1);
  }
  return engine;
}

#define SYSTEM "{\"role\": \"system\", \"content\": \"You are a careful agent. Tools: ls, cat, grep, sed, make. Answer briefly and exactly.\"}"
#define REQUEST "{\"messages\": [" SYSTEM ", {\"role\": \"user\", \"content\": \"List the files.\"}], \"max_tokens\": 6, \"temperature\": 0}"

int main(int argc, char **argv) {
  char whole[4096], preamble[4096], bad[4096];
  uint64_t tokens = 0, bytes = 0, pre_tokens = 0;
  weft_engine *first, *second, *other, *off;
  row cold, warm;
  FILE *f;
  int same, i;
  if (argc != 4) {
    fprintf(stderr, "usage: prompt_cache_test <model dir> <another model dir> <work dir>\n");
    return 2;
  }
  snprintf(whole, sizeof whole, "%s/whole.safetensors", argv[3]);
  snprintf(preamble, sizeof preamble, "%s/preamble.safetensors", argv[3]);
  snprintf(bad, sizeof bad, "%s/bad.safetensors", argv[3]);
  check(weft_abi_minor() >= 3, "weft_abi_minor() >= 3 (prompt-cache files)");

  first = open_engine(argv[1], ", \"prompt_cache_bytes\": 67108864");
  check(weft_prompt_cache_save(first, whole, NULL, &tokens, &bytes) == WEFT_ERR_NOT_FOUND, "save with nothing cached: WEFT_ERR_NOT_FOUND");
  run(first, REQUEST, &cold);
  check(cold.done == 1 && cold.n == MAX_TOKENS && cold.cached == 0, "cold run: DONE, nothing cached");
  check(weft_prompt_cache_save(first, whole, NULL, &tokens, &bytes) == WEFT_OK, "save the most recent entry");
  check(tokens >= cold.prompt && bytes > 0, "it holds the prompt (and the answer)");
  check(weft_prompt_cache_save(first, preamble, "{\"messages\": [" SYSTEM "]}", &pre_tokens, NULL) == WEFT_OK,
        "save the entry for a prompt (the system message)");
  check(pre_tokens > 0 && pre_tokens < cold.prompt, "it holds that prompt's cached prefix");
  check(weft_prompt_cache_save(first, whole, "{\"messages\": 3}", NULL, NULL) == WEFT_ERR_INVALID_ARGUMENT, "a bad prompt_json");
  check(weft_prompt_cache_save(first, NULL, NULL, NULL, NULL) == WEFT_ERR_INVALID_ARGUMENT, "a NULL path");
  weft_engine_free(first);

  second = open_engine(argv[1], ", \"prompt_cache_bytes\": 67108864");
  check(weft_prompt_cache_load(second, whole, &tokens, &bytes) == WEFT_OK, "a new engine loads the entry");
  check(weft_prompt_cache_load(second, preamble, NULL, NULL) == WEFT_OK, "and the preamble's");
  run(second, REQUEST, &warm);
  same = warm.n == cold.n;
  for (i = 0; same && i < warm.n; i++) same = warm.tokens[i] == cold.tokens[i];
  check(warm.done == 1 && warm.cached > 0, "the same request reuses it (cached_tokens > 0)");
  check(same, "with the cold run's tokens");
  check(weft_prompt_cache_load(second, "/nonexistent/entry.safetensors", NULL, NULL) == WEFT_ERR_NOT_FOUND, "a missing file: WEFT_ERR_NOT_FOUND");
  f = fopen(bad, "wb");
  fputs("not a cache file", f);
  fclose(f);
  check(weft_prompt_cache_load(second, bad, NULL, NULL) == WEFT_ERR_INVALID_ARGUMENT && strstr(weft_last_error(), "prompt-cache file") != NULL,
        "a corrupt file: WEFT_ERR_INVALID_ARGUMENT, saying which file");
  weft_engine_free(second);

  other = open_engine(argv[2], ", \"prompt_cache_bytes\": 67108864");
  check(weft_prompt_cache_load(other, whole, NULL, NULL) == WEFT_ERR_INVALID_ARGUMENT && strstr(weft_last_error(), "saved for another model") != NULL,
        "another model's file: refused, saying so");
  weft_engine_free(other);

  off = open_engine(argv[1], ", \"prompt_cache_bytes\": 0");
  check(weft_prompt_cache_load(off, whole, NULL, NULL) == WEFT_ERR_UNSUPPORTED, "a cache that is off: WEFT_ERR_UNSUPPORTED");
  weft_engine_free(off);

  printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
