// The addon loads from any working directory (libmlx is found through the rpath), and what the
// runtime sees matches the declared API.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import * as weft from 'weft'
import { modelDir } from './support.mjs'

const pkg = join(dirname(fileURLToPath(import.meta.url)), '..')

test('require() works from another directory with no library path set', () => {
  const env = { ...process.env }
  delete env.LD_LIBRARY_PATH
  delete env.DYLD_LIBRARY_PATH
  const script = `
    const { Engine } = require(${JSON.stringify(pkg)});
    Engine.load({ model: ${JSON.stringify(modelDir)} })
      .then(async (e) => { const r = await e.complete({ promptIds: [187], maxTokens: 2, ignoreEos: true }); await e.close(); console.log(r.tokenIds.join(',')) })
      .catch((err) => { console.error(err); process.exit(1) })`
  const out = execFileSync(process.execPath, ['-e', script], { cwd: tmpdir(), env, encoding: 'utf8' })
  assert.equal(out.trim(), '91,24')
})

test('the package exports Engine, Generation and WeftError', () => {
  assert.deepEqual(Object.keys(weft).filter((k) => k !== 'default').sort(), ['Engine', 'Generation', 'WeftError'])
  assert.equal(typeof weft.Engine.load, 'function')
  const e = new weft.WeftError('m', 'MODEL_LOAD')
  assert.ok(e instanceof Error)
  assert.equal(e.code, 'MODEL_LOAD')
  assert.equal(e.name, 'WeftError')
})

test('a process that never closes its engine still exits cleanly', () => {
  const script = `
    const { Engine } = require(${JSON.stringify(pkg)});
    Engine.load({ model: ${JSON.stringify(modelDir)} }).then((e) => {
      e.generate({ promptIds: [187], maxTokens: 1000, ignoreEos: true }).next().then(() => console.log('ok'))
    })`
  const out = execFileSync(process.execPath, ['-e', script], { cwd: tmpdir(), encoding: 'utf8', timeout: 60000 })
  assert.equal(out.trim(), 'ok')
})

test('a Generation garbage-collected before its end cancels its row', () => {
  const gc = process.versions.bun ? 'Bun.gc(true)' : 'global.gc()'
  const script = `
    const { Engine } = require(${JSON.stringify(pkg)});
    (async () => {
      const e = await Engine.load({ model: ${JSON.stringify(modelDir)} });
      await (async () => { await e.generate({ promptIds: [187], maxTokens: 1500, ignoreEos: true }).next() })();
      const end = Date.now() + 20000;
      while (e.stats().activeRows !== 0 || e.stats().queuedRows !== 0) {
        if (Date.now() > end) { console.log('still active'); process.exit(1) }
        ${gc};
        await new Promise((r) => setTimeout(r, 10));
      }
      const finished = e.stats().tokensGenerated;
      await e.close();
      console.log(finished < 1500 ? 'cancelled' : 'ran to the end');
    })().catch((err) => { console.error(err); process.exit(1) })`
  const args = process.versions.bun ? ['-e', script] : ['--expose-gc', '-e', script]
  const out = execFileSync(process.execPath, args, { cwd: tmpdir(), encoding: 'utf8', timeout: 60000 })
  assert.equal(out.trim(), 'cancelled')
})
