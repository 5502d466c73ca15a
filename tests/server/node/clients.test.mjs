// The official `openai` npm client against `weft serve` on the default model: greedy outputs
// equal mlx-lm's goldens (goldens/smollm2.json), chat streaming and not, and completions.
// Prefill is slow on the CPU backend, so each test asks about one golden chat (the Python
// suite, test_goldens.py, covers all four).
//
//   WEFT_URL=http://127.0.0.1:8080 WEFT_API_KEY=... WEFT_MODEL_ID=... \
//   WEFT_GOLDENS=../../../goldens/smollm2.json node --test clients.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const URL = process.env.WEFT_URL ?? 'http://127.0.0.1:8080';
const MODEL = process.env.WEFT_MODEL_ID ?? 'default_model';
const GOLDENS = JSON.parse(readFileSync(process.env.WEFT_GOLDENS ?? '../../../goldens/smollm2.json', 'utf8'));
const MAX_TOKENS = 48;

const client = new OpenAI({ baseURL: `${URL}/v1`, apiKey: process.env.WEFT_API_KEY || 'none', maxRetries: 0, timeout: 300_000 });

const FRANCE = GOLDENS.chats[0]; // "The capital of France is Paris."

test('chat completions equal the goldens', async () => {
  await Promise.all([FRANCE].map(async (c) => {
    const r = await client.chat.completions.create({ model: MODEL, messages: c.messages, max_tokens: MAX_TOKENS, temperature: 0 });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(r.choices[0].message.content, c.text);
    assert.equal(r.choices[0].finish_reason, c.finish_reason);
    assert.equal(r.usage.prompt_tokens, c.prompt_ids.length);
    assert.equal(r.usage.completion_tokens, c.tokens.length);
  }));
});

test('streamed chat completions equal the goldens', async () => {
  await Promise.all([FRANCE].map(async (c) => {
    const stream = await client.chat.completions.create({
      model: MODEL, messages: c.messages, max_tokens: MAX_TOKENS, temperature: 0, stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let finish = null;
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices) {
        text += choice.delta.content ?? '';
        finish = choice.finish_reason ?? finish;
      }
    }
    assert.equal(text, c.text);
    assert.equal(finish, c.finish_reason);
    assert.equal(usage.completion_tokens, c.tokens.length);
  }));
});

test('completions equal the goldens', async () => {
  await Promise.all([FRANCE].map(async (c) => {
    const r = await client.completions.create({ model: MODEL, prompt: c.prompt_text, max_tokens: MAX_TOKENS, temperature: 0 });
    assert.equal(r.choices[0].text, c.text);
    assert.equal(r.choices[0].finish_reason, c.finish_reason);
  }));
});

test('the stream helper and an aborted stream', async () => {
  const c = FRANCE;
  // The SDK's own accumulating helper.
  const runner = client.chat.completions.stream({ model: MODEL, messages: c.messages, max_tokens: MAX_TOKENS, temperature: 0 });
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].message.content, c.text);
  // Aborting mid-stream (the client goes away) must not break the server for the next call.
  const controller = new AbortController();
  const stream = await client.chat.completions.create(
    { model: MODEL, messages: c.messages, max_tokens: MAX_TOKENS, temperature: 0, stream: true, ignore_eos: true },
    { signal: controller.signal },
  );
  let n = 0;
  try {
    for await (const _ of stream) {
      if (++n === 2) controller.abort();
    }
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIUserAbortError, `unexpected ${e}`);
  }
  assert.ok(n < MAX_TOKENS, `the aborted stream went on (${n} chunks)`);
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [MODEL]);
});

test('errors surface as the SDK error classes', async () => {
  // Any model name is accepted (the served id is echoed); unknown ones 404 only on lookup.
  const any = await client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 });
  assert.equal(any.model, MODEL);
  await assert.rejects(
    client.models.retrieve('no-such-model'),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && e.message.includes(MODEL),
  );
  await assert.rejects(
    client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], temperature: -1 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'temperature',
  );
  const keyless = new OpenAI({ baseURL: `${URL}/v1`, apiKey: 'wrong', maxRetries: 0 });
  if (process.env.WEFT_API_KEY) {
    await assert.rejects(keyless.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  }
});
