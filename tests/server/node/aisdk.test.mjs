// The AI SDK (`ai` with `@ai-sdk/openai`, whose default `openai(model)` speaks the Responses API)
// against `weft serve` on the tiny goldens GGUF (random weights): text generation streamed and
// not, `streamText` with a required tool, and a two-step `generateText` loop (call, tool result,
// answer). Run by tests/server.rs beside test_agents.py.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

const openai = createOpenAI({ baseURL: `${process.env.WEFT_URL}/v1`, apiKey: process.env.WEFT_API_KEY || "none" });
const model = openai(process.env.WEFT_MODEL_ID);

// The city is an enum: a random model's forced call completes within a few tokens. One call a
// turn (`parallelToolCalls: false`): with more allowed, a random model goes on calling until the
// length runs out, and the AI SDK runs no tools after a `length` finish.
const one = { openai: { parallelToolCalls: false } };
const weather = tool({
  description: "Weather in a city",
  inputSchema: z.object({ city: z.enum(["Paris", "Rome"]) }),
  execute: async ({ city }) => `sunny in ${city}`,
});

test("generateText and streamText give the same text", async () => {
  const opts = { model, prompt: "Tell me about the sea.", maxOutputTokens: 12, temperature: 0 };
  const r = await generateText(opts);
  assert.ok(r.usage.outputTokens >= 1 && r.usage.outputTokens <= 12, JSON.stringify(r.usage));
  assert.ok(["length", "stop"].includes(r.finishReason), r.finishReason);
  const s = streamText(opts);
  let text = "";
  for await (const part of s.fullStream) {
    if (part.type === "error") throw part.error;
    if (part.type === "text-delta") text += part.text;
  }
  assert.equal(text, r.text);
  assert.equal(await s.finishReason, r.finishReason);
});

test("streamText with a required tool delivers a complete call", async () => {
  const s = streamText({ model, prompt: "Weather in Paris?", tools: { get_weather: weather }, toolChoice: "required",
                         temperature: 0, maxOutputTokens: 40, providerOptions: one });
  const calls = [];
  for await (const part of s.fullStream) {
    if (part.type === "error") throw part.error;
    if (part.type === "tool-call") calls.push(part);
  }
  assert.equal(calls.length, 1);
  assert.equal(calls[0].toolName, "get_weather");
  assert.ok(["Paris", "Rome"].includes(calls[0].input.city), JSON.stringify(calls[0].input));
  const results = await s.toolResults;
  assert.equal(results[0].output, `sunny in ${calls[0].input.city}`);
});

test("generateText runs the tool loop: call, result, answer", async () => {
  const r = await generateText({
    model, prompt: "Weather in Paris?", tools: { get_weather: weather }, temperature: 0, maxOutputTokens: 60,
    providerOptions: one,
    stopWhen: stepCountIs(2),
    prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? "required" : "none" }),
  });
  assert.equal(r.steps.length, 2);
  assert.equal(r.steps[0].toolCalls.length, 1);
  assert.equal(r.steps[0].toolResults[0].output, `sunny in ${r.steps[0].toolCalls[0].input.city}`);
  assert.equal(r.steps[1].toolCalls.length, 0);
});
