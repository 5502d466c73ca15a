"""Reasoning-model chat templates: transformers' own renderer on real templates.

Writes goldens/reasoning_templates.json, read by tests/tokenizer_reasoning_templates.rs: for each
template in goldens/templates/ (see its README for provenance) and each conversation below
(thinking on / off / unset, tools, tool-call history, reasoning history), the exact string
transformers' `render_jinja_template` (what `apply_chat_template(tokenize=False)` uses)
produces with `chat_template_kwargs` passed as extra template variables, or the error it raised.

    .venv/bin/python goldens/make_reasoning_template_goldens.py

Pinned: transformers 5.24.0, jinja2 3.1.6 (scripts/requirements-oracle.txt). gpt-oss's and
Llama 3.2's templates print today's date (`strftime_now`, as 2026-12-02 and 02 Dec 2026): it is
stored as `<<TODAY>>` and `<<TODAY_DMY>>`, which the test replaces with its own date the same way.
"""

import json
from datetime import datetime
from pathlib import Path

import transformers
from jinja2.sandbox import SandboxedEnvironment
from transformers.utils import chat_template_utils
from transformers.utils.chat_template_utils import render_jinja_template

HERE = Path(__file__).resolve().parent
OUT = HERE / "reasoning_templates.json"
TEMPLATES = sorted((HERE / "templates").glob("*.jinja"))

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "days": {"type": "integer", "description": "Forecast days"},
            },
            "required": ["city"],
        },
    },
}


def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


USER = {"role": "user", "content": "Weather in Paris?"}
CONVERSATIONS = [
    ("one user turn", None, [USER]),
    ("system and user", None, [{"role": "system", "content": "Be brief."}, USER]),
    ("tools", [WEATHER], [USER]),
    (
        "reasoning history",
        None,
        [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4.", "reasoning_content": "Two plus two is four."},
            {"role": "user", "content": "And 3+3?"},
        ],
    ),
    (
        "tool call history with reasoning",
        [WEATHER],
        [
            USER,
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "I should call the weather tool.",
                "tool_calls": [call("call_1", "get_weather", {"city": "Paris", "days": 2})],
            },
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp": 21.5}'},
        ],
    ),
    (
        "parallel tool calls",
        [WEATHER],
        [
            USER,
            {
                "role": "assistant",
                "content": "Checking both.",
                "tool_calls": [
                    call("call_1", "get_weather", {"city": "Paris", "days": 2}),
                    call("call_2", "get_weather", {"city": "Oslo\nNorway <&>"}),
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": "rain"},
        ],
    ),
]
# chat_template_kwargs: unset, thinking on, thinking off.
KWARGS = [("default", {}), ("thinking on", {"enable_thinking": True, "thinking": True}), ("thinking off", {"enable_thinking": False, "thinking": False})]


def render_mutable(source, messages, tools, kwargs):
    """transformers' renderer with jinja2's mutable sandbox in place of the immutable one."""
    immutable = chat_template_utils.ImmutableSandboxedEnvironment
    chat_template_utils.ImmutableSandboxedEnvironment = SandboxedEnvironment
    chat_template_utils._compile_jinja_template.cache_clear()
    try:
        rendered, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=source,
                                            add_generation_prompt=True, bos_token="<s>", eos_token="</s>", **kwargs)
        return rendered[0]
    finally:
        chat_template_utils.ImmutableSandboxedEnvironment = immutable
        chat_template_utils._compile_jinja_template.cache_clear()


def main():
    cases = []
    templates = {}
    for path in TEMPLATES:
        name = path.stem
        source = path.read_text()
        templates[name] = source
        for title, tools, messages in CONVERSATIONS:
            for kw_title, kwargs in KWARGS:
                case = {"template": name, "title": f"{title}, {kw_title}", "tools": tools, "messages": messages, "kwargs": kwargs}
                try:
                    rendered, _ = render_jinja_template(
                        conversations=[messages],
                        tools=tools,
                        chat_template=source,
                        add_generation_prompt=True,
                        bos_token="<s>",
                        eos_token="</s>",
                        **kwargs,
                    )
                    now = datetime.now()
                    case["text"] = (
                        rendered[0]
                        .replace(now.strftime("%Y-%m-%d"), "<<TODAY>>")
                        .replace(now.strftime("%d %b %Y"), "<<TODAY_DMY>>")
                    )
                except Exception as e:  # the template's own raise_exception, or a Jinja error
                    case["error"] = f"{type(e).__name__}: {e}"
                    if "SecurityError" in case["error"]:
                        # Kimi K2's templates `append` to a list (tool history), which the
                        # immutable sandbox refuses: the same renderer with a mutable sandbox.
                        case["text_mutable_sandbox"] = render_mutable(source, messages, tools, kwargs)
                cases.append(case)
    out = {"transformers_version": transformers.__version__, "templates": templates, "cases": cases}
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    ok = sum("text" in c for c in cases)
    print(f"wrote {OUT} ({len(cases)} cases, {ok} rendered, {len(cases) - ok} raised)")


if __name__ == "__main__":
    main()
