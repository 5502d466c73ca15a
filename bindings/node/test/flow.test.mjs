// Back-pressure: a stream nobody reads parks its own row in the engine (no unbounded buffer, no
// effect on other rows) and continues exactly where it stopped once it is read.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Engine } from 'weft'
import { modelDir, singles, collect, waitFor } from './support.mjs'

let engine
before(async () => {
  engine = await Engine.load({ model: modelDir, maxBatch: 8 })
})
after(async () => {
  await engine?.close()
})

test('an unread stream is parked while its twin runs to completion, then resumes exactly', async () => {
  const { promptIds } = singles[2]
  const request = { promptIds, maxTokens: 300, ignoreEos: true }
  const unread = engine.generate(request)
  const twin = await collect(engine.generate(request))
  assert.equal(twin.ids.length, 300)
  await waitFor(() => engine.stats().pausedRows === 1, 'the unread row parked')
  assert.equal(engine.stats().activeRows, 0)

  const late = await collect(unread)
  assert.deepEqual(late.ids, twin.ids)
  assert.equal(unread.summary.finishReason, 'length')
  assert.equal(engine.stats().pausedRows, 0)
})

test('a quantized-KV engine streams and batches (kvBits 8, group 32)', async () => {
  const q = await Engine.load({ model: modelDir, kvBits: 8, kvGroupSize: 32 })
  try {
    const outs = await Promise.all(singles.slice(0, 3).map((g) => q.complete({ promptIds: g.promptIds, maxTokens: 24, ignoreEos: true })))
    for (const o of outs) {
      assert.equal(o.tokenIds.length, 24)
      assert.equal(o.finishReason, 'length')
    }
  } finally {
    await q.close()
  }
})
