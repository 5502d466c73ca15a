// The committed index.d.ts type-checks, and describes the API as a TypeScript user writes it
// (test/types-check.ts, including @ts-expect-error lines for wrong usage).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const pkg = join(dirname(fileURLToPath(import.meta.url)), '..')
const require = createRequire(import.meta.url)

// Once is enough: under Bun (same files) it is skipped, the check being about index.d.ts.
const skip = process.versions.bun ? 'the type check runs under Node' : false

test('tsc --noEmit accepts index.d.ts and the typed usage', { skip }, () => {
  const tsc = join(dirname(require.resolve('typescript/package.json')), 'bin', 'tsc')
  assert.ok(existsSync(tsc))
  execFileSync(process.execPath, [tsc, '--noEmit', '-p', join(pkg, 'tsconfig.json')], { stdio: 'pipe', encoding: 'utf8' })
})
