#!/usr/bin/env node
// A tiny streaming chat with Weft from Node.js (or Bun: `bun examples/node/chat.mjs`).
//
//   (cd bindings/node && npm ci && npm run build)   # once: builds bindings/node/weft.node
//   node examples/node/chat.mjs                     # default model, interactive
//   node examples/node/chat.mjs "Tell me a joke"    # one answer
//   WEFT_MODEL=path/to/model node examples/node/chat.mjs
//
// Ctrl-C while it answers stops that answer (AbortSignal); Ctrl-C at the prompt exits.
import { createRequire } from 'node:module'
import * as readline from 'node:readline/promises'

// Inside this repository the package is bindings/node; an app would `import { Engine } from 'weft'`.
const { Engine, WeftError } = createRequire(import.meta.url)('../../bindings/node')

const engine = await Engine.load({ model: process.env.WEFT_MODEL || undefined })
const messages = [{ role: 'system', content: 'You are a helpful assistant. Answer briefly.' }]

let current = null // the AbortController of the answer being streamed

async function answer(question) {
  messages.push({ role: 'user', content: question })
  const controller = (current = new AbortController())
  const onSigint = () => controller.abort()
  process.once('SIGINT', onSigint)
  let reply = ''
  try {
    const generation = engine.generate({ messages, maxTokens: 256, temperature: 0.7, topP: 0.9, signal: controller.signal })
    for await (const chunk of generation) {
      process.stdout.write(chunk.text)
      reply += chunk.text
    }
    const { finishReason, usage } = generation.summary
    process.stdout.write(`\n[${usage.completionTokens} tokens, ${finishReason}]\n`)
  } finally {
    process.off('SIGINT', onSigint)
    current = null
  }
  messages.push({ role: 'assistant', content: reply })
}

try {
  const question = process.argv.slice(2).join(' ')
  if (question) {
    await answer(question)
  } else {
    const rl = readline.createInterface({ input: process.stdin, output: process.stdout, prompt: '> ' })
    // In a terminal, readline receives Ctrl-C: stop the answer, or quit at the prompt.
    rl.on('SIGINT', () => (current ? current.abort() : rl.close()))
    console.log(`Chatting with ${engine.modelInfo.path} (empty line or Ctrl-D to quit)`)
    rl.prompt()
    for await (const line of rl) {
      if (!line.trim()) break
      await answer(line)
      rl.prompt()
    }
    rl.close()
  }
} catch (e) {
  if (e instanceof WeftError) console.error(`weft: ${e.message} (${e.code})`)
  else throw e
  process.exitCode = 1
} finally {
  await engine.close()
}
