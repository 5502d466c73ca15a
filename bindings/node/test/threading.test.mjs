// Tokenization and chat-template rendering run off the JS thread: cheap checks still throw at
// once, a prompt that is refused only once tokenized rejects with the same code and message,
// and results equal those of the token-id path. On the tiny GGUF with an embedded tokenizer.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { join } from 'node:path'
import { readFileSync } from 'node:fs'
import { Engine, WeftError } from 'weft'
import { repoRoot, collect } from './support.mjs'

const gguf = join(repoRoot, 'goldens', 'gguf', 'llama-q4_1.gguf')
// mlx-lm's tokenizer of the GGUF (add_bos off): text -> ids.
const tokenized = JSON.parse(readFileSync(join(repoRoot, 'goldens', 'gguf', 'llama-q4_1.json'), 'utf8')).tokenizer

let engine
before(async () => {
  engine = await Engine.load({ model: gguf })
})
after(async () => {
  await engine?.close()
})

test('text prompts give what their token ids give', async () => {
  for (const { text, ids } of tokenized) {
    const options = { maxTokens: 6, ignoreEos: true }
    const byText = await engine.complete({ prompt: text, ...options })
    const byIds = await engine.complete({ promptIds: ids, ...options })
    assert.deepEqual(byText.tokenIds, byIds.tokenIds, text)
    assert.equal(byText.text, byIds.text, text)
    assert.equal(byText.usage.promptTokens, ids.length, text)
    const streamed = await collect(engine.generate({ prompt: text, ...options }))
    assert.deepEqual(streamed.ids, byIds.tokenIds, text)
  }
})

test('cheap checks still throw at generate, before any tokenization', () => {
  const long = 'x'.repeat(1 << 20)
  for (const [options, pattern] of [
    [{ prompt: long, maxTokens: 0 }, /maxTokens must be an integer/],
    [{ prompt: long, stop: [''] }, /stop\[0\] must not be empty/],
    [{ prompt: long, logitBias: { 99999: 1 } }, /outside the vocabulary/],
    [{ messages: [{ role: 'tool', content: long }] }, /needs a `tool_call_id`/],
  ]) {
    assert.throws(() => engine.generate(options), (e) => e instanceof WeftError && pattern.test(e.message), String(pattern))
  }
})

// ~800 kB of text (~375k tokens, the model's context is 2048): its tokenization takes
// far longer than one turn of the event loop, and only its token count shows it is too long.
const huge = 'The capital of France is Paris. '.repeat(25_000)

async function refusal(start) {
  let ticks = 0
  const timer = setInterval(() => ticks++, 1)
  const t0 = Date.now()
  try {
    let error
    const settled = start().then(
      () => assert.fail('a prompt over the context was accepted'),
      (e) => {
        error = e
      },
    )
    await settled
    return { error, ticks, ms: Date.now() - t0 }
  } finally {
    clearInterval(timer)
  }
}

test('a huge prompt is tokenized off the JS thread and refused with its own code', async () => {
  // generate() returns; the refusal (it needs the token count) arrives at next().
  let generation
  const g = await refusal(async () => {
    generation = engine.generate({ prompt: huge, maxTokens: 4 })
    return generation.next()
  })
  assert.ok(g.error instanceof WeftError, String(g.error))
  assert.equal(g.error.code, 'INVALID_ARGUMENT', g.error.message)
  assert.match(g.error.message, /the prompt has \d+ tokens; the model's context of 2048 leaves no room for output/)
  // The event loop kept turning while the prompt was tokenized.
  assert.ok(g.ticks > 0, `no timer fired during ${g.ms} ms of tokenization`)
  assert.deepEqual(await generation.next(), { done: true, value: undefined })

  const c = await refusal(() => engine.complete({ prompt: huge, maxTokens: 4 }))
  assert.equal(c.error.code, 'INVALID_ARGUMENT')
  assert.equal(c.error.message, g.error.message)
  assert.ok(c.ticks > 0, `no timer fired during ${c.ms} ms of tokenization`)

  // The engine still serves.
  const { ids } = tokenized[0]
  const r = await engine.complete({ prompt: tokenized[0].text, maxTokens: 2, ignoreEos: true })
  assert.equal(r.usage.promptTokens, ids.length)
})

test('a request cancelled while it is tokenized ends cancelled; close() waits for queued tokenization', async () => {
  const medium = 'numbers 2024 and 3.14 '.repeat(20)
  const g = engine.generate({ prompt: medium, maxTokens: 50, ignoreEos: true })
  g.cancel()
  const out = await collect(g)
  assert.equal(g.summary.finishReason, 'cancelled')
  assert.ok(out.ids.length < 50)

  const own = await Engine.load({ model: gguf })
  const pending = [own.generate({ prompt: medium, maxTokens: 50, ignoreEos: true }), own.complete({ prompt: medium, maxTokens: 50, ignoreEos: true })]
  await own.close()
  const streamed = await collect(pending[0])
  assert.ok(streamed.ids.length < 50)
  assert.equal(pending[0].summary.finishReason, 'cancelled')
  assert.equal((await pending[1]).finishReason, 'cancelled')
})
