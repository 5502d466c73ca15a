// A reasoning model: a tiny Qwen3.5 with the real Qwen3 vocabulary and Qwen3.5 template, written
// by tests/node.rs (WEFT_TEST_QWEN35_MODEL). The template leaves the model in its <think> block,
// so a random model's output is reasoning until a budget closes the block; `chunk.reasoning`
// carries it apart from `text`.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Engine } from 'weft'

const model = process.env.WEFT_TEST_QWEN35_MODEL
const skip = model ? false : 'WEFT_TEST_QWEN35_MODEL is not set (tests/node.rs sets it)'
const messages = [{ role: 'user', content: 'Why is the sky blue?' }]

test('reasoning streams apart from the answer, a budget closes it, thinking can be turned off', { skip }, async () => {
  const engine = await Engine.load({ model })
  try {
    let reasoning = ''
    let text = ''
    let answerBeforeReasoningEnded = false
    for await (const c of engine.generate({ messages, maxTokens: 12, reasoningBudget: 3 })) {
      if (c.reasoning && text) answerBeforeReasoningEnded = true
      reasoning += c.reasoning ?? ''
      text += c.text
    }
    assert.ok(reasoning.length > 0, 'reasoning streamed')
    assert.ok(!answerBeforeReasoningEnded, 'reasoning first, then the answer')
    const r = await engine.complete({ messages, maxTokens: 12, reasoningBudget: 3 })
    assert.equal(r.reasoning, reasoning)
    assert.equal(r.text, text)
    assert.ok(r.usage.reasoningTokens > 3 && r.usage.reasoningTokens < 12, `${r.usage.reasoningTokens}`)
    const open = await engine.complete({ messages, maxTokens: 6 })
    assert.equal(open.text, '', 'an unfinished block is all reasoning')
    assert.equal(open.usage.reasoningTokens, 6)
    const off = await engine.complete({ messages, maxTokens: 4, chatTemplateKwargs: { enable_thinking: false } })
    assert.equal(off.reasoning, undefined)
    assert.equal(off.usage.reasoningTokens, 0)
  } finally {
    await engine.close()
  }
})
