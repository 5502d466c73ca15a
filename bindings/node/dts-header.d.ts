/* The `weft` package: Weft's LLM engine for Node.js, Electron and Bun. */

/** What kind of failure a {@link WeftError} is. */
export type WeftErrorCode =
  /** An option has the wrong type or value, an unknown option, or a request the model cannot serve. */
  | 'INVALID_ARGUMENT'
  /** The request can never fit the engine's limits (e.g. more KV than the whole budget). */
  | 'CAPACITY'
  /** The model is missing, unreadable, inconsistent, or could not be downloaded or verified. */
  | 'MODEL_LOAD'
  /** The model uses an architecture or option Weft does not implement. */
  | 'UNSUPPORTED'
  /** A model download was cancelled through `Engine.load`'s `signal`. */
  | 'CANCELLED'
  /** The engine was closed. */
  | 'ENGINE_CLOSED'
  /** The engine's thread failed (a bug): every request got an error; load a new engine. */
  | 'ENGINE_FAILED'
  /** A request failed while generating (its stream or `complete` promise reports it). */
  | 'GENERATION_FAILED'
  /** A failure inside the engine or MLX. */
  | 'INTERNAL'
  /** No such thing: a prompt-cache file that does not exist, nothing cached to save. */
  | 'NOT_FOUND'

/** Every error the Weft API throws or rejects with. */
export declare class WeftError extends Error {
  constructor(message: string, code: WeftErrorCode)
  readonly name: 'WeftError'
  readonly code: WeftErrorCode
}

export interface Generation {
  [Symbol.asyncIterator](): Generation
}

