// Compiled by `tsc --noEmit` (test/types.test.mjs, test.sh): the public API as a TypeScript
// user writes it. Never run.
import { Engine, Generation, WeftError } from 'weft'
import type { Chunk, Completion, EngineStats, FinishReason, GenerateOptions, TokenLogprob, TokenLogprobs, Tool, ToolCall, ToolCallDelta, WeftErrorCode } from 'weft'

export async function quickStart(): Promise<string> {
  const engine: Engine = await Engine.load({ model: 'path/to/model', maxBatch: 4 })
  const controller = new AbortController()
  const options: GenerateOptions = {
    messages: [{ role: 'user', content: 'Hi' }],
    maxTokens: 64,
    temperature: 0.7,
    topP: 0.9,
    seed: 1,
    stop: ['\n\n'],
    signal: controller.signal,
  }
  let text = ''
  const generation: Generation = engine.generate(options)
  for await (const chunk of generation) {
    const c: Chunk = chunk
    text += c.text + String(c.tokenId) + String(c.logprob ?? 0) + String(c.topLogprobs?.length ?? 0)
  }
  const summary: Completion | null = generation.summary
  const reason: FinishReason | undefined = summary?.finishReason
  if (reason === 'cancelled' || reason === 'stop' || reason === 'length') text += reason

  const r: Completion = await engine.complete({ promptIds: [1, 2, 3], stop: 'x', logprobs: true, topLogprobs: 2 })
  const lp: TokenLogprobs | undefined = r.logprobs?.[0]
  const alt: TokenLogprob | undefined = lp?.topLogprobs[0]
  text += String((lp?.logprob ?? 0) + (alt?.tokenId ?? 0))
  const n: number = r.usage.promptTokens + r.usage.completionTokens + r.usage.cachedTokens
  const ids: number[] = r.tokenIds
  const stats: EngineStats = engine.stats()
  const active: number = stats.activeRows + n + ids.length
  const step = await engine.generate({ prompt: 'x' }).next()
  if (!step.done) text += step.value.text
  else if (step.value) text += step.value.finishReason
  try {
    await engine.close()
  } catch (e) {
    if (e instanceof WeftError) {
      const code: WeftErrorCode = e.code
      text += code + e.message
    }
  }
  return text + active + engine.modelInfo.modelType
}

export async function toolLoop(engine: Engine): Promise<string> {
  const tool: Tool = { type: 'function', function: { name: 'f', parameters: { type: 'object' } } }
  const options: GenerateOptions = { messages: [{ role: 'user', content: 'q' }], tools: [tool], toolChoice: 'required', parallelToolCalls: false }
  let args = ''
  for await (const chunk of engine.generate(options)) {
    const pieces: ToolCallDelta[] | undefined = chunk.toolCalls
    for (const d of pieces ?? []) args += (d.id ?? '') + (d.name ?? '') + (d.arguments ?? '') + String(d.index)
  }
  const r = await engine.complete({ ...options, toolChoice: { type: 'function', function: { name: 'f' } }, jsonSchema: undefined })
  const calls: ToolCall[] = r.toolCalls ?? []
  const reason: FinishReason = r.finishReason
  if (reason === 'tool_calls' && calls[0]) {
    const c = calls[0]
    await engine.complete({
      messages: [
        { role: 'assistant', content: null, toolCalls: [{ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } }] },
        { role: 'tool', toolCallId: c.id, content: 'ok' },
      ],
      tools: [tool],
    })
  }
  return args
}

// @ts-expect-error promptIds must be numbers
export const bad1: GenerateOptions = { promptIds: ['1'] }
// @ts-expect-error unknown option
export const bad2: GenerateOptions = { max_tokens: 3 }
// @ts-expect-error toolChoice is a closed set
export const bad4: GenerateOptions = { toolChoice: 'sometimes' }
// @ts-expect-error finish reasons are a closed set
export const bad3: FinishReason = 'eos'
