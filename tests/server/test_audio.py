"""Audio input through the official clients on the tiny Gemma 4 audio model
(goldens/models/gemma4-audio-lm: word-level tokenizer "t<id>", `<|audio|>` = 250, a template
that writes the turns' text): OpenAI `input_audio` and `audio_url` (data:) parts give mlx-vlm's
greedy tokens (goldens/audio_engine.json); remote URLs, unknown formats and undecodable bytes
are 400s naming the part; the Anthropic endpoint refuses audio pointing to the OpenAI one;
/v1/models says audio.

    WEFT_URL=... WEFT_MODEL_ID=tiny-audio WEFT_GOLDENS=goldens .venv/bin/python tests/server/test_audio.py
"""
import base64
import json
import os
import unittest
from pathlib import Path

import anthropic
import openai

from wire import API_KEY, MODEL_ID, URL

GOLDENS = Path(os.environ.get("WEFT_GOLDENS", Path(__file__).resolve().parents[2] / "goldens"))
GOLDEN = json.loads((GOLDENS / "audio_engine.json").read_text())
CASES = {c["name"]: c for c in GOLDEN["cases"]}


def oai():
    return openai.OpenAI(base_url=URL + "/v1", api_key=API_KEY or "none", max_retries=0, timeout=120)


def clip_b64(name):
    return base64.b64encode((GOLDENS / CASES[name]["clip"]).read_bytes()).decode()


def chat(part, max_tokens=16):
    # "t2 t10" <|audio|> "t11 t12": the golden's prompt_template_ids [2, 10, 250, 11, 12].
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "t2 t10 "}, part, {"type": "text", "text": " t11 t12"}]}]
    return oai().chat.completions.create(
        model=MODEL_ID, messages=messages, max_tokens=max_tokens, temperature=0, logprobs=True,
        extra_body={"ignore_eos": True})


def tokens(r):
    return [c.token for c in r.choices[0].logprobs.content]


def want(name):
    return [f"t{t}" for t in CASES[name]["tokens"]]


class Audio(unittest.TestCase):
    def test_models_say_audio(self):
        m = oai().models.list().data[0]
        self.assertEqual(m.model_extra["capabilities"], {"vision": False, "audio": True})

    def test_input_audio_gives_the_reference_tokens(self):
        r = chat({"type": "input_audio", "input_audio": {"data": clip_b64("tones-44k-stereo"), "format": "wav"}})
        self.assertEqual(tokens(r), want("tones-44k-stereo"))
        self.assertEqual(r.usage.prompt_tokens, len(CASES["tones-44k-stereo"]["prompt_ids"]))

    def test_audio_url_data_url_gives_the_reference_tokens(self):
        url = "data:audio/wav;base64," + clip_b64("tones-16k-mono")
        r = chat({"type": "audio_url", "audio_url": {"url": url}})
        self.assertEqual(tokens(r), want("tones-16k-mono"))

    def test_concurrent_audio_and_text_requests_keep_their_tokens(self):
        from concurrent.futures import ThreadPoolExecutor

        parts = [{"type": "input_audio", "input_audio": {"data": clip_b64(n), "format": "wav"}}
                 for n in ["short-16k-mono", "tones-44k-stereo", "short-16k-mono"]]
        with ThreadPoolExecutor(3) as pool:
            got = list(pool.map(lambda p: tokens(chat(p)), parts))
        self.assertEqual(got, [want("short-16k-mono"), want("tones-44k-stereo"), want("short-16k-mono")])

    def bad(self, part, *needles):
        with self.assertRaises(openai.BadRequestError) as e:
            chat(part, max_tokens=2)
        text = json.dumps(e.exception.body)
        for n in needles:
            self.assertIn(n, text)

    def test_bad_audio_is_a_400_naming_the_part(self):
        self.bad({"type": "audio_url", "audio_url": {"url": "https://example.com/a.wav"}},
                 "remote URLs are not fetched", "messages[0].content[1].audio_url")
        self.bad({"type": "input_audio", "input_audio": {"data": clip_b64("short-16k-mono"), "format": "aac"}},
                 "not supported", "input_audio.format")
        self.bad({"type": "input_audio", "input_audio": {"data": "@@@", "format": "wav"}}, "invalid base64")
        junk = base64.b64encode(b"GIF89a not audio " * 8).decode()
        self.bad({"type": "input_audio", "input_audio": {"data": junk, "format": "wav"}},
                 "audio[0]", "unsupported or unreadable format")
        # Still serving.
        r = chat({"type": "input_audio", "input_audio": {"data": clip_b64("short-16k-mono")}})
        self.assertEqual(tokens(r), want("short-16k-mono"))

    def test_anthropic_audio_points_to_the_openai_endpoint(self):
        c = anthropic.Anthropic(base_url=URL, api_key=API_KEY or "none", max_retries=0, timeout=120)
        with self.assertRaises(anthropic.BadRequestError) as e:
            c.messages.create(model=MODEL_ID, max_tokens=4, messages=[{"role": "user", "content": [
                {"type": "text", "text": "t2"},
                {"type": "input_audio", "input_audio": {"data": clip_b64("short-16k-mono"), "format": "wav"}}]}])
        text = json.dumps(e.exception.body)
        self.assertIn("/v1/chat/completions", text)
        self.assertIn("input_audio", text)


if __name__ == "__main__":
    unittest.main(verbosity=2)
