// Invalid input fails with a WeftError carrying a code and a message that names the problem.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Engine, WeftError } from 'weft'
import { modelDir } from './support.mjs'

let engine
before(async () => {
  engine = await Engine.load({ model: modelDir })
})
after(async () => {
  await engine?.close()
})

const weft = (code, pattern) => (e) => {
  assert.ok(e instanceof WeftError, `expected a WeftError, got ${e}`)
  assert.ok(e instanceof Error)
  assert.equal(e.name, 'WeftError')
  assert.equal(e.code, code, e.message)
  assert.match(e.message, pattern)
  return true
}

const cases = [
  [{ promptIds: [1], max_tokens: 3 }, /unknown field "max_tokens" \(did you mean maxTokens\?\)/],
  [{ promptIds: [1], maxTokens: 0 }, /maxTokens must be an integer in \[1, 4294967295\], got 0/],
  [{ promptIds: [1], maxTokens: 2.5 }, /maxTokens must be an integer in \[1, 4294967295\], got 2\.5/],
  [{ promptIds: [1], maxTokens: '8' }, /maxTokens must be an integer in \[1, 4294967295\], got "8"/],
  [{ promptIds: [1], temperature: Infinity }, /temperature must be a finite number >= 0, got "Infinity"/],
  [{ promptIds: [1], minP: NaN }, /minP must be a number in \[0, 1\], got "NaN"/],
  [{ promptIds: [1], temperature: -1 }, /temperature must be a finite number >= 0, got -1/],
  [{ promptIds: [1], topP: 0 }, /topP must be a number in \(0, 1\], got 0/],
  [{ promptIds: [1], seed: -3 }, /seed must be an integer >= 0, got -3/],
  [{ promptIds: [1], penaltyContext: 0 }, /penaltyContext must be an integer in \[1, 4294967295\], got 0/],
  [{ promptIds: [1], stop: [''] }, /stop\[0\] must not be empty/],
  [{ promptIds: [1], stop: [3] }, /stop\[0\] must be a string, got 3/],
  [{ promptIds: [1], signal: {} }, /signal must be an AbortSignal/],
  [{ promptIds: [1], logitBias: { x: 1 } }, /logitBias key "x" is not a token id/],
  [{ promptIds: [1], logitBias: { 5: Infinity } }, /logitBias\["5"\] must be a finite number or "-Infinity", got "Infinity"/],
  [{ promptIds: [1], stop: () => 1 }, /stop must be a plain value .*got a function/],
  [{ promptIds: [] }, /promptIds must not be empty/],
  [{ promptIds: [1, -2] }, /promptIds\[1\] must be a token id .*got -2/],
  [{ promptIds: 'abc' }, /promptIds must be an array of token ids, got "abc"/],
  [{}, /exactly one of prompt, messages or promptIds is required, got none/],
  [{ promptIds: [1], prompt: 'hi' }, /exactly one of prompt, messages or promptIds is required, got prompt and promptIds/],
  [{ messages: [{ role: 'user' }] }, /messages\[0\]\.content is required/],
  [{ messages: [{ role: 'user', content: 7 }] }, /messages\[0\]\.content must be a string, got 7/],
  [{ messages: [] }, /messages must not be empty/],
  // Checked by the engine against the model:
  [{ promptIds: [5000] }, /prompt token id 5000 is outside the vocabulary \(size 1024\)/],
  [{ prompt: 'hello' }, /no tokenizer; send token ids/],
  [{ promptIds: [1], logitBias: { 4096: 1 } }, /logit_bias token id 4096 is outside the vocabulary/],
]

test('generate() throws WeftError INVALID_ARGUMENT synchronously', () => {
  for (const [options, pattern] of cases) {
    assert.throws(() => engine.generate(options), weft('INVALID_ARGUMENT', pattern), JSON.stringify(options))
  }
  assert.throws(() => engine.generate(), weft('INVALID_ARGUMENT', /generate options are required/))
  assert.throws(() => engine.generate(42), weft('INVALID_ARGUMENT', /the request must be an object, got 42/))
})

test('complete() rejects (never throws) with the same errors', async () => {
  for (const [options, pattern] of cases) {
    let p
    assert.doesNotThrow(() => {
      p = engine.complete(options)
    })
    await assert.rejects(p, weft('INVALID_ARGUMENT', pattern), JSON.stringify(options))
  }
})

test('a logitBias of -Infinity bans a token; the memory options load', async () => {
  // Greedy from [187] starts with 91 (the goldens); banning 91 changes the first token.
  const banned = await engine.complete({ promptIds: [187], maxTokens: 1, ignoreEos: true, logitBias: { 91: -Infinity } })
  assert.notEqual(banned.tokenIds[0], 91)
  const e = await Engine.load({ model: modelDir, clearCacheEverySteps: 4, cacheLimitBytes: 1 << 20 })
  try {
    const r = await e.complete({ promptIds: [187], maxTokens: 2, ignoreEos: true })
    assert.deepEqual(r.tokenIds, [91, 24])
  } finally {
    await e.close()
  }
})

test('a failed request leaves the engine serving others', async () => {
  assert.throws(() => engine.generate({ promptIds: [5000] }), WeftError)
  const r = await engine.complete({ promptIds: [187], maxTokens: 2, ignoreEos: true })
  assert.deepEqual(r.tokenIds, [91, 24])
})

test('Engine.load rejects bad paths with MODEL_LOAD and bad options with INVALID_ARGUMENT', async () => {
  await assert.rejects(Engine.load({ model: '/nonexistent/model' }), weft('MODEL_LOAD', /\/nonexistent\/model/))
  await assert.rejects(Engine.load({ model: modelDir, maxBatch: 0 }), weft('INVALID_ARGUMENT', /maxBatch must be an integer in \[1, 4096\], got 0/))
  await assert.rejects(Engine.load({ modle: modelDir }), weft('INVALID_ARGUMENT', /unknown field "modle" \(did you mean model\?\)/))
  await assert.rejects(Engine.load({ model: '' }), weft('INVALID_ARGUMENT', /model must be a non-empty path/))
  await assert.rejects(Engine.load({ model: modelDir, memoryLimitBytes: 0 }), weft('INVALID_ARGUMENT', /memoryLimitBytes must be an integer >= 1, got 0/))
  await assert.rejects(Engine.load({ model: modelDir, clearCacheEverySteps: -1 }), weft('INVALID_ARGUMENT', /clearCacheEverySteps must be an integer >= 0, got -1/))
  await assert.rejects(Engine.load({ model: modelDir, kvBits: 7 }), weft('INVALID_ARGUMENT', /kv_bits must be 2, 3, 4, 5, 6 or 8, got 7/))
  // the tiny model's head size is 32: the default group of 64 cannot quantize it
  await assert.rejects(Engine.load({ model: modelDir, kvBits: 4 }), weft('INVALID_ARGUMENT', /does not divide the model's head_dim 32/))
  await assert.rejects(Engine.load('x'), weft('INVALID_ARGUMENT', /the engine options must be an object, got "x"/))
})

test('the classes cannot be constructed directly', () => {
  assert.throws(() => new Engine())
})
