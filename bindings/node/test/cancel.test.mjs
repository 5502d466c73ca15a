// Cancellation reaches the engine: AbortSignal, break, return(), cancel(), close().
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Engine, WeftError } from 'weft'
import { modelDir, singles, collect, waitFor } from './support.mjs'

let engine
before(async () => {
  engine = await Engine.load({ model: modelDir, maxBatch: 8 })
})
after(async () => {
  await engine?.close()
})

const idle = () => waitFor(() => engine.stats().activeRows === 0 && engine.stats().queuedRows === 0, 'no active rows')

// Long enough that cancellation, not maxTokens, ends it.
const LONG = 1500

test('abort mid-stream ends that iterator only', async () => {
  const [a, b, c] = singles
  const controller = new AbortController()
  const aborted = engine.generate({ promptIds: a.promptIds, maxTokens: LONG, ignoreEos: true, signal: controller.signal })
  const others = [b, c].map((g) => engine.generate({ promptIds: g.promptIds, maxTokens: 24, ignoreEos: true }))
  const othersDone = Promise.all(others.map(collect))

  const ids = []
  for await (const chunk of aborted) {
    ids.push(chunk.tokenId)
    if (ids.length === 3) controller.abort()
  }
  assert.ok(ids.length >= 3 && ids.length < LONG, `stopped after ${ids.length} tokens`)
  assert.deepEqual(ids.slice(0, 3), a.tokens.slice(0, 3))
  assert.equal(aborted.summary.finishReason, 'cancelled')
  assert.equal(aborted.summary.usage.completionTokens, aborted.summary.tokenIds.length)

  const outs = await othersDone
  assert.deepEqual(outs[0].ids, b.tokens)
  assert.deepEqual(outs[1].ids, c.tokens)
  for (const g of others) assert.equal(g.summary.finishReason, 'length')
  await idle()
})

test('breaking out of for await cancels the row in the engine', async () => {
  const g = singles[0]
  const generation = engine.generate({ promptIds: g.promptIds, maxTokens: LONG, ignoreEos: true })
  let n = 0
  for await (const chunk of generation) {
    assert.equal(chunk.tokenId, g.tokens[n])
    if (++n === 2) break
  }
  // return() resolved only after the engine released the row.
  assert.equal(generation.summary.finishReason, 'cancelled')
  assert.ok(generation.summary.usage.completionTokens < LONG)
  await idle()
  assert.deepEqual(await generation.next(), { done: true, value: undefined })
})

test('an exception thrown in the loop body cancels the row too', async () => {
  const generation = engine.generate({ promptIds: singles[1].promptIds, maxTokens: LONG, ignoreEos: true })
  await assert.rejects(async () => {
    for await (const _ of generation) throw new Error('consumer failed')
  }, /consumer failed/)
  assert.equal(generation.summary.finishReason, 'cancelled')
  await idle()
})

test('cancel() lets buffered chunks drain, then ends with cancelled', async () => {
  const generation = engine.generate({ promptIds: singles[2].promptIds, maxTokens: LONG, ignoreEos: true })
  const first = await generation.next()
  assert.equal(first.done, false)
  generation.cancel()
  const rest = await collect(generation)
  assert.ok(rest.ids.length < LONG)
  assert.equal(generation.summary.finishReason, 'cancelled')
  await idle()
})

test('an already-aborted signal: the stream ends at once, cancelled', async () => {
  const generation = engine.generate({
    promptIds: singles[0].promptIds,
    maxTokens: LONG,
    ignoreEos: true,
    signal: AbortSignal.abort(),
  })
  const { ids } = await collect(generation)
  assert.ok(ids.length < 5, `got ${ids.length} tokens`)
  assert.equal(generation.summary.finishReason, 'cancelled')
  await idle()
})

test('complete() with a signal resolves with the partial result, cancelled', async () => {
  const controller = new AbortController()
  const pending = engine.complete({ promptIds: singles[3].promptIds, maxTokens: LONG, ignoreEos: true, signal: controller.signal })
  await waitFor(() => engine.stats().tokensGenerated > 0 && engine.stats().activeRows > 0, 'decoding to start')
  controller.abort()
  const r = await pending
  assert.equal(r.finishReason, 'cancelled')
  assert.ok(r.usage.completionTokens < LONG)
  const n = Math.min(r.tokenIds.length, 24)
  assert.deepEqual(r.tokenIds.slice(0, n), singles[3].tokens.slice(0, n))
  await idle()
})

test('one signal shared by many requests, finished normally, does not keep listeners', async () => {
  const controller = new AbortController()
  let added = 0
  let removed = 0
  const signal = controller.signal
  const add = signal.addEventListener.bind(signal)
  const remove = signal.removeEventListener.bind(signal)
  signal.addEventListener = (...a) => (added++, add(...a))
  signal.removeEventListener = (...a) => (removed++, remove(...a))
  for (let i = 0; i < 12; i++) {
    await collect(engine.generate({ promptIds: singles[0].promptIds, maxTokens: 2, ignoreEos: true, signal }))
    await engine.complete({ promptIds: singles[1].promptIds, maxTokens: 2, ignoreEos: true, signal })
  }
  assert.equal(added, 24)
  assert.equal(removed, 24)
})

test('close() ends outstanding streams (cancelled) and later calls fail with ENGINE_CLOSED', async () => {
  const own = await Engine.load({ model: modelDir })
  const generation = own.generate({ promptIds: singles[0].promptIds, maxTokens: LONG, ignoreEos: true })
  const first = await generation.next()
  assert.equal(first.value.tokenId, singles[0].tokens[0])
  await own.close()
  assert.equal(own.closed, true)
  await collect(generation)
  assert.equal(generation.summary.finishReason, 'cancelled')
  assert.throws(() => own.generate({ promptIds: [1] }), (e) => e instanceof WeftError && e.code === 'ENGINE_CLOSED')
  await assert.rejects(own.complete({ promptIds: [1] }), (e) => e instanceof WeftError && e.code === 'ENGINE_CLOSED')
  assert.throws(() => own.stats(), (e) => e instanceof WeftError && e.code === 'ENGINE_CLOSED')
  await own.close() // twice is harmless
})
