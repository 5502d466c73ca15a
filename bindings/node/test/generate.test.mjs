// Generation through the addon equals mlx-lm's goldens, alone and 8 requests at once.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Engine } from 'weft'
import { modelDir, singles, batchRows, collect, waitFor } from './support.mjs'

let engine
before(async () => {
  engine = await Engine.load({ model: modelDir, maxBatch: 8 })
})
after(async () => {
  await engine?.close()
})

test('modelInfo describes the loaded model', () => {
  const info = engine.modelInfo
  assert.equal(info.modelType, 'llama')
  assert.equal(info.vocabSize, 1024)
  assert.equal(info.hasTokenizer, false)
  assert.equal(info.path, modelDir)
})

test('greedy generation equals the mlx-lm goldens token for token', async () => {
  for (const g of singles) {
    const generation = engine.generate({ promptIds: g.promptIds, maxTokens: g.tokens.length, ignoreEos: true })
    const { ids } = await collect(generation)
    assert.deepEqual(ids, g.tokens)
    const s = generation.summary
    assert.equal(s.finishReason, 'length')
    assert.deepEqual(s.tokenIds, g.tokens)
    // The prompt cache (on by default) may hold a prefix of the prompt from an earlier row.
    const { cachedTokens, ...usage } = s.usage
    assert.deepEqual(usage, { promptTokens: g.promptIds.length, completionTokens: g.tokens.length, reasoningTokens: 0 })
    assert.ok(cachedTokens < g.promptIds.length, `cachedTokens ${cachedTokens}`)
  }
})

test('8 concurrent generates share the batch and each equals its goldens', async () => {
  const rows = [...batchRows, ...singles].slice(0, 8)
  assert.equal(rows.length, 8)
  await waitFor(() => engine.stats().activeRows === 0, 'an idle engine')
  const before = engine.stats()
  const generations = rows.map((r) =>
    engine.generate({ promptIds: r.promptIds, maxTokens: r.tokens.length, ignoreEos: true }),
  )
  const outputs = await Promise.all(generations.map(collect))
  outputs.forEach((o, i) => assert.deepEqual(o.ids, rows[i].tokens, `row ${i}`))
  const after = await waitFor(() => {
    const s = engine.stats()
    return s.activeRows === 0 && s.requestsFinished === before.requestsFinished + 8 && s
  }, 'the batch to drain')
  // Batched: far fewer decode steps than tokens (one step decodes every active row).
  const tokens = after.tokensGenerated - before.tokensGenerated
  const steps = after.decodeSteps - before.decodeSteps
  assert.ok(tokens >= rows.reduce((n, r) => n + r.tokens.length, 0) - 8, `tokens ${tokens}`)
  assert.ok(steps * 2 < tokens, `${steps} decode steps for ${tokens} tokens: not batched`)
})

test('the iterator protocol: next() after the end, summary value once', async () => {
  const g = singles[0]
  const generation = engine.generate({ promptIds: g.promptIds, maxTokens: 3, ignoreEos: true })
  assert.equal(generation.summary, null)
  assert.equal(generation[Symbol.asyncIterator](), generation)
  const seen = []
  for (;;) {
    const r = await generation.next()
    if (r.done) {
      assert.equal(r.value.finishReason, 'length')
      assert.deepEqual(r.value.tokenIds, g.tokens.slice(0, 3))
      break
    }
    seen.push(r.value.tokenId)
  }
  assert.deepEqual(seen, g.tokens.slice(0, 3))
  assert.deepEqual(await generation.next(), { done: true, value: undefined })
})

test('parallel next() calls are answered in order', async () => {
  const g = singles[1]
  const generation = engine.generate({ promptIds: g.promptIds, maxTokens: 5, ignoreEos: true })
  const results = await Promise.all(Array.from({ length: 7 }, () => generation.next()))
  assert.deepEqual(
    results.slice(0, 5).map((r) => r.value.tokenId),
    g.tokens.slice(0, 5),
  )
  assert.equal(results[5].done, true)
  assert.equal(results[5].value.finishReason, 'length')
  assert.deepEqual(results[6], { done: true, value: undefined })
})

test('a slow consumer back-pressures only itself: the engine runs ahead into its buffer', async () => {
  const [a, b] = singles
  const slow = engine.generate({ promptIds: a.promptIds, maxTokens: 24, ignoreEos: true })
  const fast = engine.generate({ promptIds: b.promptIds, maxTokens: 24, ignoreEos: true })
  const first = await slow.next() // the slow consumer reads one chunk, then stalls
  const fastOut = await collect(fast)
  assert.deepEqual(fastOut.ids, b.tokens)
  // Meanwhile the slow row was not held back: the engine finished it into its queue.
  await waitFor(() => slow.summary !== null, 'the slow row to finish in the engine')
  assert.equal(slow.summary.finishReason, 'length')
  const rest = await collect(slow)
  assert.deepEqual([first.value.tokenId, ...rest.ids], a.tokens)
})

test('complete() returns text, token ids, finish reason and usage', async () => {
  const g = singles[3]
  const r = await engine.complete({ promptIds: g.promptIds, maxTokens: 10, ignoreEos: true })
  assert.deepEqual(r.tokenIds, g.tokens.slice(0, 10))
  assert.equal(r.finishReason, 'length')
  // This prompt ran before: all of it but the last token comes from the prompt cache (on by default).
  assert.deepEqual(r.usage, { promptTokens: g.promptIds.length, completionTokens: 10, cachedTokens: g.promptIds.length - 1, reasoningTokens: 0 })
  assert.equal(typeof r.text, 'string')
})

test('complete() stops at an end-of-sequence token and does not count it', async () => {
  // singles[2]'s greedy trajectory reaches EOS id 5 at index 15.
  const g = singles[2]
  const at = g.tokens.findIndex((t) => t === 2 || t === 5)
  assert.ok(at > 0)
  const r = await engine.complete({ promptIds: g.promptIds, maxTokens: 24 })
  assert.equal(r.finishReason, 'stop')
  assert.deepEqual(r.tokenIds, g.tokens.slice(0, at))
  assert.equal(r.usage.completionTokens, at)
  assert.equal(r.usage.promptTokens, g.promptIds.length)
})

test('concurrent complete() calls', async () => {
  const rs = await Promise.all(
    singles.map((g) => engine.complete({ promptIds: g.promptIds, maxTokens: 24, ignoreEos: true })),
  )
  rs.forEach((r, i) => assert.deepEqual(r.tokenIds, singles[i].tokens))
  const stats = engine.stats()
  assert.ok(stats.requestsFinished >= singles.length)
  assert.ok(stats.tokensGenerated >= 24 * singles.length)
})
