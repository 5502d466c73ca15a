// Randomized option objects for Engine.load and generate() / complete(): odd JS values (NaN,
// -0, BigInt, symbols, functions, lone surrogates, huge arrays, Proxies, throwing getters) in
// the real option names and in misspelled ones, and option objects that are themselves hostile.
// Every case must throw (generate) or reject (complete, load) with a WeftError whose code is
// not INTERNAL, or be accepted and then end; never crash the process or hang. One exception is
// tolerated as it stands: an exception the caller's own getter or Proxy throws propagates
// synchronously, also out of complete() and Engine.load, which otherwise never throw.
// A fixed seed by default; explore with WEFT_FUZZ_SEED=<n> WEFT_FUZZ_CASES=<multiplier>.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Engine, WeftError } from 'weft'
import { modelDir, singles, collect } from './support.mjs'

const SEED = Number(process.env.WEFT_FUZZ_SEED ?? 12345) >>> 0
const SCALE = Math.max(1, Number(process.env.WEFT_FUZZ_CASES ?? 1) | 0)
const LIMIT_MS = 20000

// xorshift32: deterministic, seeded.
function random(seed) {
  let x = seed || 1
  return () => {
    x ^= x << 13
    x >>>= 0
    x ^= x >>> 17
    x ^= x << 5
    x >>>= 0
    return x / 4294967296
  }
}

const LOAD_KEYS = ['model', 'maxBatch', 'promptConcurrency', 'prefillStepSize', 'kvBudgetBytes', 'promptCacheBytes', 'kvBits', 'kvGroupSize', 'quantizedKvStart']
const GENERATE_KEYS = ['messages', 'prompt', 'promptIds', 'maxTokens', 'temperature', 'topP', 'topK', 'minP', 'repetitionPenalty', 'presencePenalty', 'frequencyPenalty', 'penaltyContext', 'logitBias', 'seed', 'stop', 'ignoreEos', 'numDraftTokens', 'signal']

class Boom extends Error {}

/** A value picker over `next` (a uniform [0, 1) source). */
function values(next) {
  const pick = (xs) => xs[Math.floor(next() * xs.length)]
  const int = (n) => Math.floor(next() * n)
  const scalars = [
    undefined, null, true, false, 0, -0, 1, -1, 2, 0.5, 1.5, NaN, Infinity, -Infinity, 3, 8, 20, 21,
    1023, 1024, 2048, 4096, 4097, 2 ** 31, 2 ** 32, 2 ** 32 - 1, 2 ** 53, 2 ** 53 + 2, Number.MAX_VALUE,
    Number.MIN_VALUE, 1e-45, -1e308, '', '0', '1', 'user', '\0', '\ud800', 'a\u0000b', 'x'.repeat(5000), '{{', '</s>',
  ]
  const exotic = () =>
    pick([
      () => 1n,
      () => 2n ** 64n,
      () => Symbol('s'),
      () => () => 1,
      () => new Date(0),
      () => /re/,
      () => new Uint32Array([1, 2, 3]),
      () => Object.create(null),
      () => new Proxy({}, {}),
      () => new Proxy({}, { ownKeys() { throw new Boom('ownKeys') } }),
      () => new Proxy({}, { get() { throw new Boom('get') } }),
      () => Object.defineProperty({}, 'aborted', { enumerable: true, get() { throw new Boom('getter') } }),
      () => { const a = [1, 2]; Object.defineProperty(a, 0, { get() { throw new Boom('index getter') } }); return a },
      () => [, 1], // a hole
      () => new Array(100000),
      () => Array.from({ length: int(3000) }, () => int(1100)),
      () => ({ aborted: false, addEventListener: 1 }),
      () => new AbortController().signal,
    ])()
  const value = (depth) => {
    const r = next()
    if (r < 0.5 || depth > 2) return pick(scalars)
    if (r < 0.7) return exotic()
    if (r < 0.85) return Array.from({ length: int(4) }, () => value(depth + 1))
    const o = {}
    for (let i = int(4); i > 0; i--) o[pick(['role', 'content', ...GENERATE_KEYS, String(int(2000)), 'x'])] = value(depth + 1)
    return o
  }
  return { pick, int, value }
}

/** Sometimes makes the option object itself hostile: a throwing getter, or a throwing Proxy. */
function hostile(v, o, keys) {
  const key = v.pick(keys)
  switch (v.int(12)) {
    case 0:
      return Object.defineProperty(o, key, { enumerable: true, get() { throw new Boom('option getter') } })
    case 1:
      return new Proxy(o, { ownKeys() { throw new Boom('ownKeys trap') } })
    case 2:
      return new Proxy(o, { get(t, k) { if (k === key) throw new Boom('get trap'); return t[k] } })
    default:
      return o
  }
}

/** A valid generate() request, then up to three fields replaced, removed or misspelled. */
function generateOptions(v) {
  const o = { promptIds: Array.from({ length: 1 + v.int(8) }, () => v.int(1024)), maxTokens: 1 + v.int(8) }
  for (let i = v.int(4); i > 0; i--) {
    const key = v.pick([...GENERATE_KEYS, 'max_tokens', 'maxToken', 'top_p'])
    if (v.int(5) === 0) delete o[key]
    else o[key] = v.value(0)
  }
  return hostile(v, o, GENERATE_KEYS)
}

function loadOptions(v) {
  const o = { model: modelDir }
  for (let i = v.int(4); i > 0; i--) {
    const key = v.pick([...LOAD_KEYS, 'max_batch', 'modle'])
    if (v.int(5) === 0) delete o[key]
    else o[key] = v.value(0)
  }
  // No model means the default model (a download on first use): not what this test is about.
  if (o.model === undefined || o.model === null) o.model = '/nonexistent/weft-fuzz-model'
  return hostile(v, o, LOAD_KEYS)
}

const describe = (o) => {
  try {
    return JSON.stringify(o, (_, x) => (typeof x === 'bigint' ? `${x}n` : typeof x === 'symbol' ? String(x) : x)).slice(0, 300)
  } catch {
    return String(o)
  }
}

/** A refusal: a WeftError with a known, non-internal code, or the caller's own exception. */
function assertRefusal(e, options) {
  if (e instanceof Boom) return 'boom'
  assert.ok(e instanceof WeftError, `${describe(options)}: expected a WeftError, got ${e?.stack ?? e}`)
  assert.notEqual(e.code, 'INTERNAL', `${describe(options)}: ${e.message}`)
  assert.ok(e.message.length > 0)
  return e.code
}

const withLimit = (p, what) =>
  Promise.race([p, new Promise((_, reject) => setTimeout(() => reject(new Error(`${what}: no answer within ${LIMIT_MS} ms`)), LIMIT_MS).unref())])

let engine
before(async () => {
  engine = await Engine.load({ model: modelDir })
})
after(async () => {
  await engine?.close()
})

test('randomized generate() and complete() options: an error or a stream that ends', async () => {
  const v = values(random(SEED))
  const outcomes = {}
  for (let i = 0; i < 300 * SCALE; i++) {
    const options = generateOptions(v)
    let generation
    let outcome
    try {
      generation = engine.generate(options)
    } catch (e) {
      outcome = assertRefusal(e, options)
    }
    if (generation) {
      // Read a few chunks, then leave early (which cancels the request): it must end.
      outcome = 'accepted'
      const stream = (async () => {
        let n = 0
        for await (const _ of generation) if (++n === 3) break
      })()
      await withLimit(stream, describe(options))
    } else {
      let promise
      try {
        promise = engine.complete(options)
      } catch (e) {
        assert.ok(e instanceof Boom, `${describe(options)}: complete() threw ${e?.stack ?? e}`)
      }
      if (promise) {
        const refused = promise.then(
          () => assert.fail(`${describe(options)}: complete() accepted what generate() refused`),
          (e) => assertRefusal(e, options),
        )
        await withLimit(refused, describe(options))
      }
    }
    outcomes[outcome] = (outcomes[outcome] ?? 0) + 1
  }
  console.log('generate outcomes:', outcomes)
  assert.ok(outcomes.accepted > 0 && outcomes.INVALID_ARGUMENT > 0, JSON.stringify(outcomes))
  // The engine still answers mlx-lm's greedy trajectory.
  const { promptIds, tokens } = singles[0]
  const { ids } = await collect(engine.generate({ promptIds, maxTokens: tokens.length, ignoreEos: true }))
  assert.deepEqual(ids, tokens)
})

test('randomized Engine.load options: an error or an engine that serves and closes', async () => {
  const v = values(random(SEED ^ 0x9e3779b9))
  const outcomes = {}
  for (let i = 0; i < 60 * SCALE; i++) {
    const options = loadOptions(v)
    let outcome
    try {
      // (A Boom from the caller's own getter comes synchronously; everything else rejects.)
      const e = await withLimit(Engine.load(options), describe(options))
      outcome = 'loaded'
      const r = await withLimit(e.complete({ promptIds: [1, 2], maxTokens: 2 }).catch((err) => err), describe(options))
      if (r instanceof Error) assertRefusal(r, options)
      await withLimit(e.close(), `close after ${describe(options)}`)
    } catch (e) {
      if (e?.message?.includes('no answer within')) throw e
      outcome = assertRefusal(e, options)
    }
    outcomes[outcome] = (outcomes[outcome] ?? 0) + 1
  }
  console.log('load outcomes:', outcomes)
  assert.ok(outcomes.loaded > 0 && outcomes.INVALID_ARGUMENT > 0, JSON.stringify(outcomes))
})
