// Constrained output (responseFormat, jsonSchema, regex, choice) on the tiny GGUF model with an
// embedded tokenizer: random weights give valid output only because the constraint works.
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

const schema = {
  type: 'object',
  properties: { name: { type: 'string', maxLength: 8 }, n: { type: 'integer', minimum: 0, maximum: 99 } },
  required: ['name', 'n'],
  additionalProperties: false,
}

test('responseFormat json_schema and jsonSchema give schema-valid JSON, streamed or not', async () => {
  const r = await engine.complete({
    prompt: 'The sea',
    maxTokens: 60,
    responseFormat: { type: 'json_schema', json_schema: { name: 'thing', schema, strict: true } },
  })
  assert.equal(r.finishReason, 'stop')
  const v = JSON.parse(r.text)
  assert.deepEqual(Object.keys(v).sort(), ['n', 'name'])
  assert.ok(typeof v.name === 'string' && v.name.length <= 8 && Number.isInteger(v.n) && v.n >= 0 && v.n <= 99, r.text)
  let streamed = ''
  for await (const c of engine.generate({ prompt: 'The sea', maxTokens: 60, jsonSchema: schema })) streamed += c.text
  assert.equal(streamed, r.text)
})

test('regex and choice', async () => {
  const r = await engine.complete({ prompt: 'The sea', maxTokens: 20, regex: '[a-z]{2,5}-[0-9]{2}' })
  assert.match(r.text, /^[a-z]{2,5}-[0-9]{2}$/)
  const c = await engine.complete({ prompt: 'The sea', maxTokens: 20, choice: ['calm', 'rough'] })
  assert.ok(['calm', 'rough'].includes(c.text), c.text)
})

test('bad constraints throw INVALID_ARGUMENT at generate', () => {
  for (const [opts, needle] of [
    [{ jsonSchema: { type: 'nosuch' } }, 'json_schema'],
    [{ regex: 'a', choice: ['b'] }, 'at most one of'],
    [{ responseFormat: { type: 'json' } }, 'responseFormat.type'],
    [{ choice: [] }, 'choice must not be empty'],
  ]) {
    assert.throws(
      () => engine.generate({ prompt: 'a', ...opts }),
      (e) => e.code === 'INVALID_ARGUMENT' && e.message.includes(needle),
      JSON.stringify(opts),
    )
  }
})
