'use strict'
// Loads the native addon (weft.node, built by `npm run build` / test.sh) and completes the API
// with what is JavaScript by nature: the WeftError class and Generation's async-iterator hook.
// The same file works in Node.js, Electron (main process) and Bun: N-API is ABI-stable.

const path = require('node:path')

function loadAddon() {
  const candidates = []
  if (process.env.WEFT_NODE_ADDON) candidates.push(path.resolve(process.env.WEFT_NODE_ADDON))
  candidates.push(path.join(__dirname, `weft.${process.platform}-${process.arch}.node`))
  candidates.push(path.join(__dirname, 'weft.node'))
  const errors = []
  for (const file of candidates) {
    try {
      return require(file)
    } catch (e) {
      // Keep going only when this candidate does not exist; a present but broken addon (e.g. a
      // missing libmlx) must surface its own error.
      if (e && e.code === 'MODULE_NOT_FOUND' && String(e.message).includes(file)) {
        errors.push(file)
        continue
      }
      throw e
    }
  }
  throw new Error(
    `weft: native addon not found (looked for ${errors.join(', ')}). ` +
      'Build it with `npm run build` in bindings/node, or set WEFT_NODE_ADDON to its path.',
  )
}

const native = loadAddon()

/** Every error the Weft API throws or rejects with. `code` says which kind it is. */
class WeftError extends Error {
  constructor(message, code) {
    super(message)
    this.name = 'WeftError'
    this.code = code
  }
}

native.__registerErrorClass(WeftError)

const { Engine, Generation } = native

// `for await (const chunk of engine.generate(...))`: a Generation is its own iterator.
Object.defineProperty(Generation.prototype, Symbol.asyncIterator, {
  value: function () {
    return this
  },
  writable: true,
  configurable: true,
})

module.exports = { Engine, Generation, WeftError }
