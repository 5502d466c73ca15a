// The final-event guarantee as Node sees it when the engine's thread dies (WEFT_FAULTS injects
// the failure in a child process): every request settles once with an error, and the engine
// then refuses new ones with ENGINE_FAILED.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { modelDir } from './support.mjs'

const pkg = join(dirname(fileURLToPath(import.meta.url)), '..')

test('a dead engine thread rejects every outstanding request once, then refuses new ones', () => {
  const script = `
    const { Engine } = require(${JSON.stringify(pkg)});
    (async () => {
      const e = await Engine.load({ model: ${JSON.stringify(modelDir)}, maxBatch: 2 });
      const outcomes = await Promise.allSettled([1, 2, 3, 4].map((t) =>
        e.complete({ promptIds: [t, 7, 9], maxTokens: 64, ignoreEos: true })));
      let after;
      try { await e.complete({ promptIds: [1, 2], maxTokens: 2 }); after = 'accepted' } catch (err) { after = err.code }
      await e.close();
      console.log(JSON.stringify({
        outcomes: outcomes.map((o) => o.status === 'rejected' ? [o.reason.code, String(o.reason.message)] : ['fulfilled', '']),
        after,
      }));
    })().catch((err) => { console.error(err); process.exit(1) })`
  const env = { ...process.env, WEFT_FAULTS: 'driver-panic@6' }
  const out = JSON.parse(execFileSync(process.execPath, ['-e', script], { env, encoding: 'utf8' }).trim().split('\n').pop())
  assert.equal(out.outcomes.length, 4)
  // Normally all four were accepted (two running, two waiting) when the thread died; on a starved
  // machine the last ones may be refused at submit instead, with ENGINE_FAILED.
  let failedInFlight = 0
  for (const [code, message] of out.outcomes) {
    assert.ok(code === 'GENERATION_FAILED' || code === 'ENGINE_FAILED', `${code}: ${message}`)
    if (code === 'GENERATION_FAILED') {
      assert.match(message, /engine thread failed/)
      failedInFlight++
    }
  }
  assert.ok(failedInFlight >= 1, JSON.stringify(out))
  assert.equal(out.after, 'ENGINE_FAILED')
})
