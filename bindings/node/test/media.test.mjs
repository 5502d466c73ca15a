// Audio (and the media fields' types) through the addon on the tiny Gemma 4 audio model
// (goldens/models/gemma4-audio-lm): a clip as a Buffer or a file path gives mlx-vlm's greedy
// tokens (goldens/audio_engine.json); modelInfo says audio; bad media are WeftErrors.
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { test } from 'node:test'

import { Engine, WeftError } from '../index.js'
import { repoRoot } from './support.mjs'

const goldens = join(repoRoot, 'goldens')
const golden = JSON.parse(readFileSync(join(goldens, 'audio_engine.json'), 'utf8'))
const cases = Object.fromEntries(golden.cases.map((c) => [c.name, c]))

test('audio clips as bytes or paths give the reference tokens', async () => {
  const engine = await Engine.load({ model: join(goldens, golden.model) })
  try {
    const info = engine.modelInfo
    assert.equal(info.audio, true)
    assert.equal(info.vision, false)
    const run = (name, clip) =>
      engine.complete({ promptIds: cases[name].prompt_template_ids, audio: [clip], maxTokens: 16, ignoreEos: true })
    const a = cases['tones-44k-stereo']
    const bytes = readFileSync(join(goldens, a.clip))
    const [fromBytes, fromPath, fromUint8] = await Promise.all([
      run('tones-44k-stereo', bytes),
      run('short-16k-mono', join(goldens, cases['short-16k-mono'].clip)),
      run('tones-44k-stereo', new Uint8Array(bytes)),
    ])
    assert.deepEqual(fromBytes.tokenIds, a.tokens)
    assert.deepEqual(fromUint8.tokenIds, a.tokens)
    assert.deepEqual(fromPath.tokenIds, cases['short-16k-mono'].tokens)
    await assert.rejects(run('tones-44k-stereo', Buffer.from('not audio at all, just some bytes')), (e) => {
      assert.ok(e instanceof WeftError)
      assert.match(e.message, /audio\[0\].*unsupported or unreadable format/)
      return true
    })
    await assert.rejects(run('tones-44k-stereo', new Float32Array(4)), /audio\[0\] must be a Uint8Array/)
    await assert.rejects(run('tones-44k-stereo', 'https://example.com/a.wav'), /remote URLs are not fetched/)
  } finally {
    await engine.close()
  }
})

test('a model without towers says so and refuses media', async () => {
  const engine = await Engine.load({ model: join(goldens, 'models', 'llama-fp32') })
  try {
    const info = engine.modelInfo
    assert.equal(info.audio, false)
    assert.equal(info.vision, false)
    const wav = readFileSync(join(goldens, cases['short-16k-mono'].clip))
    await assert.rejects(engine.complete({ promptIds: [1, 2], audio: [wav], maxTokens: 2 }), /no audio tower/)
    await assert.rejects(engine.complete({ promptIds: [1, 2], images: [wav], maxTokens: 2 }), /no vision tower/)
  } finally {
    await engine.close()
  }
})
