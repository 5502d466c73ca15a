// index.d.ts (generated from the Rust source, committed) and the runtime agree: every declared
// class member exists, every runtime member is declared, and the option names the addon accepts
// are exactly the declared LoadOptions / GenerateOptions fields.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { Engine, Generation, WeftError } from 'weft'
import { modelDir } from './support.mjs'

const dts = readFileSync(join(dirname(fileURLToPath(import.meta.url)), '..', 'index.d.ts'), 'utf8')

/** `{ body }` of `export declare class Name` / `export interface Name` (top level only). */
function block(kind, name) {
  const m = dts.match(new RegExp(`^export (?:declare )?${kind} ${name} (?:extends [^{]+)?\\{\\n([\\s\\S]*?)^\\}`, 'm'))
  assert.ok(m, `${kind} ${name} not in index.d.ts`)
  return m[1]
}

function declaredMembers(name) {
  const members = { static: new Set(), instance: new Set() }
  for (const line of block('class', name).split('\n')) {
    const m = line.match(/^  (static )?(?:get )?(\w+)\(/)
    if (m) members[m[1] ? 'static' : 'instance'].add(m[2])
  }
  return members
}

function declaredFields(name) {
  return new Set([...block('interface', name).matchAll(/^  (\w+)\??:/gm)].map((m) => m[1]))
}

const own = (o) => Object.getOwnPropertyNames(o).filter((k) => !['constructor', 'length', 'name', 'prototype', 'arguments', 'caller'].includes(k))

test('declared class members are exactly the runtime ones', () => {
  for (const [name, cls] of [['Engine', Engine], ['Generation', Generation]]) {
    const d = declaredMembers(name)
    assert.deepEqual(new Set(own(cls.prototype)), d.instance, `${name} instance members`)
    assert.deepEqual(new Set(own(cls)), d.static, `${name} static members`)
  }
  assert.equal(typeof Generation.prototype[Symbol.asyncIterator], 'function')
  assert.match(dts, /\[Symbol\.asyncIterator\]\(\): Generation/)
  assert.match(dts, /export declare class WeftError extends Error/)
  assert.equal(WeftError.name, 'WeftError')
})

let engine
before(async () => {
  engine = await Engine.load({ model: modelDir })
})
after(async () => {
  await engine?.close()
})

test('the addon accepts exactly the declared GenerateOptions fields', () => {
  const fields = declaredFields('GenerateOptions')
  assert.ok(fields.has('promptIds') && fields.has('signal') && fields.size >= 15)
  for (const key of fields) {
    // `undefined` is "not given", but an unknown key is still rejected by name.
    if (key === 'promptIds') continue
    const g = engine.generate({ promptIds: [187], maxTokens: 1, [key]: undefined })
    g.cancel()
  }
  assert.throws(() => engine.generate({ promptIds: [187], notAnOption: 1 }), /unknown field "notAnOption"/)
})

test('Engine.load accepts exactly the declared LoadOptions fields', async () => {
  const fields = declaredFields('LoadOptions')
  assert.ok(fields.has('model') && fields.has('maxBatch'))
  for (const key of fields) {
    const e = await Engine.load({ model: modelDir, [key]: undefined })
    await e.close()
  }
  await assert.rejects(Engine.load({ model: modelDir, notAnOption: 1 }), /unknown field "notAnOption"/)
})

test('returned objects carry the declared fields', async () => {
  // With logprobs every optional field is present but `toolCalls` (only with tools: tools.test.mjs)
  // and `reasoning` (only for a model that reasons: reasoning.test.mjs).
  const noTools = (fields) => new Set([...fields].filter((f) => f !== 'toolCalls' && f !== 'reasoning'))
  const r = await engine.complete({ promptIds: [187], maxTokens: 2, ignoreEos: true, logprobs: true, topLogprobs: 1 })
  assert.deepEqual(new Set(Object.keys(r)), noTools(declaredFields('Completion')))
  assert.deepEqual(new Set(Object.keys(r.logprobs[0])), declaredFields('TokenLogprobs'))
  assert.deepEqual(new Set(Object.keys(r.logprobs[0].topLogprobs[0])), declaredFields('TokenLogprob'))
  const plain = await engine.complete({ promptIds: [187], maxTokens: 2, ignoreEos: true })
  for (const k of Object.keys(plain)) assert.ok(declaredFields('Completion').has(k), `completion.${k} is not declared`)
  assert.deepEqual(new Set(Object.keys(r.usage)), declaredFields('Usage'))
  const stats = engine.stats()
  const statsFields = declaredFields('EngineStats')
  for (const k of Object.keys(stats)) assert.ok(statsFields.has(k), `stats.${k} is not declared`)
  const info = engine.modelInfo
  for (const k of Object.keys(info)) assert.ok(declaredFields('ModelInfo').has(k), `modelInfo.${k} is not declared`)
  // Held in a variable: a Generation collected while its next() is pending is cancelled.
  const g = engine.generate({ promptIds: [187], maxTokens: 1, ignoreEos: true, logprobs: true })
  const chunk = (await g.next()).value
  assert.deepEqual(new Set(Object.keys(chunk)), noTools(declaredFields('Chunk')))
  g.cancel()
})
