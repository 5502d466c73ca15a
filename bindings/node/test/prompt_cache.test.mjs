// Prompt-cache entries saved to a file and loaded into a new engine (savePromptCache /
// loadPromptCache): the same prompt then reuses the entry and still equals mlx-lm's golden
// trajectory; bad, missing and other-model files are refused with their codes; the stats
// report the cache's counters.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Engine, WeftError } from 'weft'
import { modelDir, repoRoot, singles, waitFor } from './support.mjs'

const g = singles[1]
const request = { promptIds: g.promptIds, maxTokens: g.tokens.length, ignoreEos: true }

test('an entry saved by one engine serves the same prompt on a new one, exactly', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'weft-node-cache-'))
  const file = join(dir, 'entry.safetensors')
  const prefix = join(dir, 'prefix.safetensors')
  try {
    const first = await Engine.load({ model: modelDir, promptCacheBytes: 64 << 20 })
    await assert.rejects(first.savePromptCache(file), (e) => e instanceof WeftError && e.code === 'NOT_FOUND')
    const cold = await first.complete(request)
    assert.deepEqual(cold.tokenIds, g.tokens)
    assert.equal(cold.usage.cachedTokens, 0)
    const saved = await first.savePromptCache(file)
    assert.ok(saved.tokens >= g.promptIds.length && saved.bytes > 0, JSON.stringify(saved))
    const part = await first.savePromptCache(prefix, { promptIds: g.promptIds.slice(0, 5) })
    assert.equal(part.tokens, 5)
    await first.close()

    const second = await Engine.load({ model: modelDir, promptCacheBytes: 64 << 20 })
    const loaded = await second.loadPromptCache(file)
    assert.deepEqual(loaded, saved)
    let stats = await waitFor(() => { const s = second.stats(); return s.promptCacheEntries >= 1 && s }, 'the entry in the stats')
    assert.equal(stats.promptCacheEntries, 1)
    assert.equal(stats.promptCacheCapacityBytes, 64 << 20)
    assert.ok(stats.promptCacheBytes > 0)
    const warm = await second.complete(request)
    assert.deepEqual(warm.tokenIds, g.tokens)
    assert.equal(warm.usage.cachedTokens, g.promptIds.length - 1)
    stats = await waitFor(() => { const s = second.stats(); return s.promptCacheHits >= 1 && s }, 'the hit in the stats')
    assert.equal(stats.promptCacheHits, 1)
    assert.equal(stats.promptCacheCachedTokens, g.promptIds.length - 1)
    assert.equal(stats.promptCacheEvictions, 0)
    assert.deepEqual(stats.promptCacheFilesRefused, [])

    await assert.rejects(second.loadPromptCache(join(dir, 'missing.safetensors')), (e) => e.code === 'NOT_FOUND')
    writeFileSync(join(dir, 'bad.safetensors'), 'not a cache file')
    await assert.rejects(second.loadPromptCache(join(dir, 'bad.safetensors')), (e) => e.code === 'INVALID_ARGUMENT' && /prompt-cache file/.test(e.message))
    await assert.rejects(second.savePromptCache(file, { promptIds: 'x' }), (e) => e instanceof WeftError && e.code === 'INVALID_ARGUMENT')
    await second.close()
    await assert.rejects(second.loadPromptCache(file), (e) => e.code === 'ENGINE_CLOSED')

    const other = await Engine.load({ model: join(repoRoot, 'goldens', 'models', 'llama-bf16'), promptCacheBytes: 64 << 20 })
    await assert.rejects(other.loadPromptCache(file), (e) => e.code === 'INVALID_ARGUMENT' && /saved for another/.test(e.message))
    await other.close()

    const off = await Engine.load({ model: modelDir, promptCacheBytes: 0 })
    await assert.rejects(off.loadPromptCache(file), (e) => e.code === 'UNSUPPORTED')
    await off.close()
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
})
