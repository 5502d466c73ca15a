"""openai-agents (the OpenAI Agents SDK) in its default Responses mode against `weft serve` on
the tiny goldens GGUF: an agent that must call its function tool (the run ends on the tool's
result), streamed and not, and an agent with a structured output type (text.format
json_schema). The model's weights are random: the tool call and the JSON are valid because
the engine's grammars make them so.

    WEFT_URL=... WEFT_API_KEY=... WEFT_MODEL_ID=tiny .venv/bin/python tests/server/test_agents_sdk.py
"""
import asyncio
import unittest
from typing import Literal

from agents import (Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled)
from openai import AsyncOpenAI
from pydantic import BaseModel

from wire import API_KEY, MODEL_ID, URL

set_tracing_disabled(True)  # traces would go to OpenAI's servers


def model():
    client = AsyncOpenAI(base_url=URL + "/v1", api_key=API_KEY or "none", max_retries=0, timeout=120)
    return OpenAIResponsesModel(model=MODEL_ID, openai_client=client)


CALLS = []


@function_tool
def get_weather(city: Literal["Paris", "Rome"]) -> str:
    """The weather in a city."""
    CALLS.append(city)
    return f"sunny in {city}"


class Weather(BaseModel):
    sky: Literal["sunny", "cloudy"]
    warm: bool


class AgentsSdk(unittest.TestCase):
    def test_function_tool_agent(self):
        agent = Agent(name="weather", instructions="Answer with the tool.", model=model(), tools=[get_weather],
                      tool_use_behavior="stop_on_first_tool",
                      model_settings=ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=48))

        async def both():
            # One event loop: the client's connections belong to it.
            result = await Runner.run(agent, "Weather in Paris?")
            run = Runner.run_streamed(agent, "Weather in Paris?")
            kinds = [e.type async for e in run.stream_events()]
            return result.final_output, run.final_output, kinds

        CALLS.clear()
        plain, streamed, kinds = asyncio.run(both())
        self.assertEqual(len(CALLS), 2)
        self.assertEqual((plain, streamed), (f"sunny in {CALLS[0]}", f"sunny in {CALLS[1]}"))
        self.assertIn("raw_response_event", kinds)

    def test_structured_output_agent(self):
        agent = Agent(name="typed", instructions="Report the weather.", model=model(), output_type=Weather,
                      model_settings=ModelSettings(temperature=0, max_tokens=64))
        result = asyncio.run(Runner.run(agent, "Weather in Paris?"))
        self.assertIsInstance(result.final_output, Weather)


if __name__ == "__main__":
    unittest.main(verbosity=2)
