// Shared by the test files: the tiny goldens model and its mlx-lm trajectories.
import { readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

export const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..')
export const modelDir = join(repoRoot, 'goldens', 'models', 'llama-fp32')

const goldens = JSON.parse(readFileSync(join(repoRoot, 'goldens', 'llama-fp32.json'), 'utf8'))

/** Greedy single-sequence trajectories (24 tokens, EOS ignored) and mlx-lm's first-step log-probabilities. */
export const singles = goldens.single.map((s) => ({ promptIds: s.prompt_ids, tokens: s.tokens, firstLogprobs: s.first_logprobs }))

/** Rows of mlx-lm's batch_generate (each equal to its single-sequence trajectory). */
export const batchRows = goldens.batch.flatMap((b) =>
  b.rows.map((r) => ({ promptIds: r.prompt_ids, tokens: r.tokens, maxTokens: r.max_tokens })),
)

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/** Polls `fn` until it returns truthy (stats are published after each engine step). */
export async function waitFor(fn, what, timeoutMs = 5000) {
  const end = Date.now() + timeoutMs
  for (;;) {
    const v = fn()
    if (v) return v
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await sleep(5)
  }
}

export async function collect(generation) {
  const ids = []
  let text = ''
  for await (const chunk of generation) {
    if (chunk.tokenId !== undefined) ids.push(chunk.tokenId)
    text += chunk.text
  }
  return { ids, text }
}
