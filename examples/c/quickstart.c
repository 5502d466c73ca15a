#include <pthread.h>
#include <stdio.h>
#include "weft.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int done = 0;

static void on_event(void *user_data, const weft_event *ev) { /* runs on a library thread */
  (void)user_data;
  if (ev->kind != WEFT_EVENT_ERROR) { fwrite(ev->text, 1, ev->text_len, stdout); fflush(stdout); }  /* DONE: the tail */
  if (ev->kind == WEFT_EVENT_TOKEN) return;
  pthread_mutex_lock(&mu); done = 1; pthread_cond_signal(&cv); pthread_mutex_unlock(&mu); /* DONE or ERROR: last */
}

int main(void) {
  weft_engine *engine; /* NULL options: the default model, downloaded on first use */
  if (weft_engine_new(NULL, &engine) != WEFT_OK) { fprintf(stderr, "%s\n", weft_last_error()); return 1; }
  weft_submit(engine, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}]}", on_event, NULL, NULL);
  pthread_mutex_lock(&mu); while (!done) pthread_cond_wait(&cv, &mu); pthread_mutex_unlock(&mu);
  weft_engine_free(engine);
  return 0;
}
