// Engine.load with a Hugging Face repo id, from the local Hub tests/support/hub.rs runs for this
// suite (bindings/node/tests/node.rs sets HF_ENDPOINT, WEFT_TEST_HUB and an empty HF_HUB_CACHE):
// an abort during the download rejects with CANCELLED, the next load resumes and reports its
// progress in order up to `done`, a cached model loads without a download, bad hooks throw.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Engine } from 'weft'

const hub = process.env.WEFT_TEST_HUB
if (!hub && process.env.CI) throw new Error('WEFT_TEST_HUB is not set: run this suite through cargo test (tests/node.rs)')

test('a repo id downloads with progress, cancels on abort, and loads from the cache', { skip: !hub && 'no local Hub (run through cargo test)' }, async () => {
  const ac = new AbortController()
  const seen = []
  await assert.rejects(
    Engine.load({
      model: 'org/tiny',
      signal: ac.signal,
      onProgress: (p) => {
        seen.push(p.phase)
        if (p.phase === 'downloading') ac.abort()
      },
    }),
    (e) => e.name === 'WeftError' && e.code === 'CANCELLED' && /cancel/.test(e.message),
  )
  assert.equal(seen.filter((p) => p === 'downloading').length, 1, `reports after the abort: ${seen}`)

  const reports = []
  const engine = await Engine.load({ model: 'org/tiny', onProgress: (p) => reports.push(p) })
  try {
    assert.ok(reports.some((p) => p.phase === 'downloading'), JSON.stringify(reports))
    assert.equal(reports.at(-1).phase, 'done')
    for (const p of reports) {
      assert.equal(typeof p.downloaded, 'number')
      if (p.total != null) assert.ok(p.downloaded <= p.total, JSON.stringify(p))
    }
    assert.match(engine.modelInfo.path, /models--org--tiny/)
    const r = await engine.complete({ promptIds: [5, 17, 3], maxTokens: 2, ignoreEos: true })
    assert.equal(r.tokenIds.length, 2)
  } finally {
    await engine.close()
  }

  const cached = []
  const again = await Engine.load({ model: 'org/tiny', onProgress: (p) => cached.push(p.phase) })
  await again.close()
  assert.ok(!cached.includes('downloading'), `a cached model downloads nothing: ${cached}`)

  await assert.rejects(Engine.load({ model: 'org/no-such-repo' }), (e) => e.code === 'MODEL_LOAD' && /no-such-repo/.test(e.message))
})

test('an already aborted signal rejects with CANCELLED', { skip: !hub && 'no local Hub (run through cargo test)' }, async () => {
  await assert.rejects(Engine.load({ model: 'org/other', signal: AbortSignal.abort() }), (e) => e.code === 'CANCELLED')
})

test('bad download hooks are INVALID_ARGUMENT', async () => {
  await assert.rejects(Engine.load({ model: 'org/tiny', onProgress: 3 }), (e) => e.code === 'INVALID_ARGUMENT' && /onProgress/.test(e.message))
  await assert.rejects(Engine.load({ model: 'org/tiny', signal: {} }), (e) => e.code === 'INVALID_ARGUMENT' && /signal/.test(e.message))
})
