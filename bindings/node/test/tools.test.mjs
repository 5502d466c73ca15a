// Tool calls on the tiny GGUF model (random weights, a ChatML template without tools: Weft's
// fallback prompt). Forced choices with enum parameters: the output is a complete call whatever
// the weights are. Streamed `toolCalls` pieces assemble to the completion's `toolCalls`.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { join } from 'node:path'
import { Engine } from 'weft'
import { repoRoot } from './support.mjs'

let engine
before(async () => {
  engine = await Engine.load({ model: join(repoRoot, 'goldens', 'gguf', 'llama-q4_1.gguf') })
})
after(async () => {
  await engine?.close()
})

const fn = (name, key, values) => ({
  type: 'function',
  function: {
    name,
    parameters: { type: 'object', properties: { [key]: { enum: values } }, required: [key], additionalProperties: false },
  },
})
const weather = fn('get_weather', 'unit', ['c', 'f'])
const clock = fn('get_time', 'tz', ['utc', 'cet'])
const messages = [{ role: 'user', content: 'What is the weather in Oslo?' }]

async function stream(options) {
  const calls = []
  let text = ''
  const generation = engine.generate(options)
  for await (const chunk of generation) {
    text += chunk.text
    for (const d of chunk.toolCalls ?? []) {
      if (d.id !== undefined) {
        assert.equal(d.index, calls.length, 'calls start in order')
        assert.equal(d.arguments, undefined)
        calls.push({ id: d.id, name: d.name, arguments: '' })
      } else {
        assert.equal(d.name, undefined)
        calls[d.index].arguments += d.arguments
      }
    }
  }
  return { text, calls, summary: generation.summary }
}

test('a named call: finishReason tool_calls, deltas assemble to the result, no text leaked', async () => {
  const toolChoice = { type: 'function', function: { name: 'get_weather' } }
  const r = await engine.complete({ messages, maxTokens: 40, tools: [weather], toolChoice })
  assert.equal(r.finishReason, 'tool_calls')
  assert.equal(r.text, '')
  assert.deepEqual(Object.keys(r).sort(), ['finishReason', 'text', 'tokenIds', 'toolCalls', 'usage'])
  assert.deepEqual(Object.keys(r.toolCalls[0]).sort(), ['arguments', 'id', 'name'])
  assert.equal(r.toolCalls.length, 1)
  const [call] = r.toolCalls
  assert.equal(call.name, 'get_weather')
  assert.match(call.id, /^call_[A-Za-z0-9]{24}$/)
  assert.ok(['c', 'f'].includes(JSON.parse(call.arguments).unit), call.arguments)

  const s = await stream({ messages, maxTokens: 40, tools: [weather], toolChoice })
  assert.equal(s.text, '')
  assert.deepEqual(s.calls, s.summary.toolCalls)
  // Greedy: the same call (ids differ per request).
  assert.deepEqual(s.calls.map((c) => [c.name, c.arguments]), r.toolCalls.map((c) => [c.name, c.arguments]))
})

test('arguments that complete only at the end arrive in the last chunk', async () => {
  // The stop string holds back the call's tail ('"}}' and the closing tag are a prefix of it)
  // until the grammar ends the row: the engine's final event releases the last argument piece,
  // which the binding forwards as a last chunk without a token.
  const toolChoice = { type: 'function', function: { name: 'get_weather' } }
  const chunks = []
  const generation = engine.generate({ messages, maxTokens: 40, tools: [weather], toolChoice, stop: ['"}}\n</tool_call>!'] })
  for await (const chunk of generation) chunks.push(chunk)
  const { summary } = generation
  assert.equal(summary.finishReason, 'tool_calls')
  assert.equal(summary.toolCalls.length, 1)
  const last = chunks.at(-1)
  assert.equal(last.tokenId ?? null, null, 'the end\'s own chunk')
  const tail = (last.toolCalls ?? []).map((d) => d.arguments ?? '').join('')
  assert.ok(tail.length > 0, 'the last chunk carries argument text')
  const streamed = chunks.flatMap((c) => c.toolCalls ?? []).map((d) => d.arguments ?? '').join('')
  assert.equal(streamed, summary.toolCalls[0].arguments, 'the deltas concatenate to the final arguments')
})

test('required between two tools, and the call back in the history', async () => {
  const s = await stream({ messages, maxTokens: 40, tools: [weather, clock], toolChoice: 'required', parallelToolCalls: false })
  assert.equal(s.summary.finishReason, 'tool_calls')
  assert.ok(s.calls.length >= 1)
  assert.deepEqual(s.calls, s.summary.toolCalls)
  const [call] = s.calls
  const args = JSON.parse(call.arguments)
  if (call.name === 'get_weather') assert.ok(['c', 'f'].includes(args.unit), call.arguments)
  else assert.ok(call.name === 'get_time' && ['utc', 'cet'].includes(args.tz), call.arguments)

  const history = [
    ...messages,
    { role: 'assistant', content: null, toolCalls: [{ id: call.id, type: 'function', function: { name: call.name, arguments: call.arguments } }] },
    { role: 'tool', toolCallId: call.id, content: 'rain' },
  ]
  const next = await engine.complete({ messages: history, maxTokens: 4, tools: [weather, clock] })
  assert.ok(['stop', 'length', 'tool_calls'].includes(next.finishReason))
  assert.ok(Array.isArray(next.toolCalls))
})

test('without tools there are no toolCalls; bad tool options throw INVALID_ARGUMENT', async () => {
  const r = await engine.complete({ messages, maxTokens: 3 })
  assert.equal(r.toolCalls, undefined)
  for await (const c of engine.generate({ messages, maxTokens: 3 })) assert.equal(c.toolCalls, undefined)
  for (const [opts, needle] of [
    [{ tools: [weather], toolChoice: { type: 'function', function: { name: 'nosuch' } } }, 'toolChoice'],
    [{ tools: [weather], toolChoice: 'sometimes' }, 'toolChoice'],
    [{ tools: [{ type: 'function' }] }, 'tools'],
    [{ tools: [weather], prompt: 'hi', messages: undefined }, 'tools'],
    [{ messages: [{ role: 'tool', toolCallId: 'nope', content: 'x' }], tools: [weather] }, 'does not match'],
  ]) {
    assert.throws(
      () => engine.generate({ messages, ...opts }),
      (e) => e.code === 'INVALID_ARGUMENT' && e.message.includes(needle),
      JSON.stringify(opts),
    )
  }
})
