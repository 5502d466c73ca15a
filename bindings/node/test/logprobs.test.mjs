// logprobs / topLogprobs: each chunk and the completion carry the token's log-probability and the
// most likely alternatives, equal to mlx-lm's first-step log-probabilities.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Engine } from 'weft'
import { modelDir, singles } from './support.mjs'

let engine
before(async () => {
  engine = await Engine.load({ model: modelDir })
})
after(async () => {
  await engine?.close()
})

/** The k best (id, logprob) of a full distribution, best first (lowest id on ties). */
const topK = (logprobs, k) =>
  logprobs
    .map((logprob, tokenId) => ({ tokenId, logprob }))
    .sort((a, b) => b.logprob - a.logprob || a.tokenId - b.tokenId)
    .slice(0, k)

const close = (a, b, what) => assert.ok(Math.abs(a - b) < 1e-4, `${what}: ${a} vs ${b}`)

test('streamed chunks carry logprob and topLogprobs equal to mlx-lm at the first step', async () => {
  const g = singles[0]
  const chunks = []
  for await (const c of engine.generate({ promptIds: g.promptIds, maxTokens: 6, ignoreEos: true, logprobs: true, topLogprobs: 5 })) {
    chunks.push(c)
  }
  assert.deepEqual(chunks.map((c) => c.tokenId), g.tokens.slice(0, 6))
  const first = chunks[0]
  close(first.logprob, g.firstLogprobs[g.tokens[0]], 'first logprob')
  const want = topK(g.firstLogprobs, 5)
  assert.deepEqual(first.topLogprobs.map((t) => t.tokenId), want.map((t) => t.tokenId))
  first.topLogprobs.forEach((t, i) => close(t.logprob, want[i].logprob, `top ${i}`))
  for (const c of chunks) {
    assert.equal(c.topLogprobs.length, 5)
    // Greedy: the chosen token is the best one, and the list is best first.
    assert.equal(c.topLogprobs[0].tokenId, c.tokenId)
    close(c.logprob, c.topLogprobs[0].logprob, 'chosen = best')
    assert.ok(c.logprob <= 0)
    for (let i = 1; i < 5; i++) assert.ok(c.topLogprobs[i].logprob <= c.topLogprobs[i - 1].logprob)
  }
})

test('complete() returns one logprobs entry per token; without logprobs nothing is reported', async () => {
  const g = singles[1]
  const r = await engine.complete({ promptIds: g.promptIds, maxTokens: 4, ignoreEos: true, logprobs: true })
  assert.deepEqual(r.tokenIds, g.tokens.slice(0, 4))
  assert.equal(r.logprobs.length, 4)
  assert.deepEqual(r.logprobs.map((l) => l.tokenId), r.tokenIds)
  close(r.logprobs[0].logprob, g.firstLogprobs[g.tokens[0]], 'first logprob')
  assert.ok(r.logprobs.every((l) => l.topLogprobs.length === 0 && l.logprob <= 0))

  const plain = await engine.complete({ promptIds: g.promptIds, maxTokens: 2, ignoreEos: true })
  assert.equal(plain.logprobs, undefined)
  for await (const c of engine.generate({ promptIds: g.promptIds, maxTokens: 2, ignoreEos: true })) {
    assert.equal(c.logprob, undefined)
    assert.equal(c.topLogprobs, undefined)
  }
})

test('topLogprobs is checked by the contract', () => {
  assert.throws(() => engine.generate({ promptIds: [1], topLogprobs: 2 }), /topLogprobs needs logprobs: true/)
  assert.throws(
    () => engine.generate({ promptIds: [1], logprobs: true, topLogprobs: 21 }),
    /topLogprobs must be an integer in \[0, 20\], got 21/,
  )
})
