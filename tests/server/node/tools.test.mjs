// The official `openai` npm client's tool loop against `weft serve` on the default model
// (Weft's fallback tool prompt): a named call enforced by the grammar, streamed deltas that
// assemble to the non-streamed call, the tool result sent back, a text answer.
//
//   WEFT_URL=http://127.0.0.1:8080 WEFT_API_KEY=... WEFT_MODEL_ID=... node --test tools.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const URL = process.env.WEFT_URL ?? 'http://127.0.0.1:8080';
const MODEL = process.env.WEFT_MODEL_ID ?? 'default_model';
const client = new OpenAI({ baseURL: `${URL}/v1`, apiKey: process.env.WEFT_API_KEY || 'none', maxRetries: 0, timeout: 300_000 });

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'Get the current weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
const named = { type: 'function', function: { name: 'get_weather' } };

test('tool loop: call, streamed call, result, answer', async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages, tools, tool_choice: named, max_tokens: 24, temperature: 0 });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  const [call] = r.choices[0].message.tool_calls;
  assert.equal(call.function.name, 'get_weather');
  const args = JSON.parse(call.function.arguments);
  assert.equal(typeof args.city, 'string');

  const stream = await client.chat.completions.create({ model: MODEL, messages, tools, tool_choice: named, max_tokens: 24, temperature: 0, stream: true });
  const calls = [];
  let finish = null;
  for await (const chunk of stream) {
    for (const d of chunk.choices[0]?.delta?.tool_calls ?? []) {
      if (!calls[d.index]) {
        assert.equal(d.function.arguments, '');
        calls[d.index] = { id: d.id, name: d.function.name, arguments: '' };
      } else {
        calls[d.index].arguments += d.function.arguments;
      }
    }
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, 'tool_calls');
  assert.deepEqual(calls.map((c) => [c.name, c.arguments]), [['get_weather', call.function.arguments]]);

  const answer = await client.chat.completions.create({
    model: MODEL, tools, tool_choice: 'none', max_tokens: 24, temperature: 0,
    messages: [...messages, r.choices[0].message, { role: 'tool', tool_call_id: call.id, content: '{"sky": "sunny", "celsius": 24}' }],
  });
  assert.ok(answer.choices[0].message.content.trim().length > 0);
  assert.equal(answer.choices[0].message.tool_calls, undefined);
});
