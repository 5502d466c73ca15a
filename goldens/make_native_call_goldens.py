"""Native tool-call goldens: mlx-lm's own parsers on the models' raw call text.

Writes goldens/native_calls.json, read by tests/tokenizer_tool_templates.rs: for each case the
tools, the raw output as the model writes it (markers included) and the calls mlx-lm 0.32.2's
`tool_parsers.qwen3_coder` / `tool_parsers.gemma4` return for the text between the markers (what
mlx_lm.server hands them). Weft's streaming parsers (core/src/tools/native.rs) must give the same
names and the same argument values.

    .venv/bin/python goldens/make_native_call_goldens.py

Pinned: mlx-lm 0.32.2 (scripts/requirements-oracle.txt). Deterministic.
"""

import json
from pathlib import Path

from mlx_lm.tool_parsers import gemma4, qwen3_coder

OUT = Path(__file__).resolve().parent / "native_calls.json"

TOOLS = [
    {"type": "function", "function": {"name": "get_forecast", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "ratio": {"type": "number"}, "hours": {"type": "array", "items": {"type": "integer"}},
        "where": {"type": "object"}, "note": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}}}}},
]

QWEN = [
    ("one string", "<tool_call>\n<function=get_forecast>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"),
    ("typed values", "<tool_call>\n<function=get_forecast>\n<parameter=city>\nOslo\n</parameter>\n"
     "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n"
     "<parameter=hours>\n[1, 2, 3]\n</parameter>\n<parameter=where>\n{\"lat\": 59.9, \"lon\": 10.7}\n</parameter>\n"
     "</function>\n</tool_call>"),
    ("a string that looks like a number", "<tool_call>\n<function=get_forecast>\n<parameter=city>\n42\n</parameter>\n"
     "</function>\n</tool_call>"),
    ("multi-line code", "<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/main.rs\n</parameter>\n"
     "<parameter=content>\nfn main() {\n    println!(\"<hi> & bye\");\n}\n</parameter>\n</function>\n</tool_call>"),
    ("no parameters", "<tool_call>\n<function=get_forecast>\n</function>\n</tool_call>"),
]

GEMMA = [
    ("one string", "<|tool_call>call:get_forecast{city:<|\"|>Paris<|\"|>}<tool_call|>"),
    ("typed values", "<|tool_call>call:get_forecast{city:<|\"|>Oslo<|\"|>,days:3,hours:[1,2,3],metric:true,"
     "ratio:0.5,where:{lat:59.9,lon:10.7}}<tool_call|>"),
    ("punctuation in strings", "<|tool_call>call:get_forecast{note:<|\"|>a, b: {c} [d] \"e\"<|\"|>}<tool_call|>"),
    ("two calls", "<|tool_call>call:get_forecast{city:<|\"|>Paris<|\"|>}<tool_call|>"
     "<|tool_call>call:write_file{content:<|\"|>x<|\"|>,path:<|\"|>a.txt<|\"|>}<tool_call|>"),
]


def inner(text, start, end):
    """The regions between the markers, as mlx_lm.server hands them to a parser."""
    out, rest = [], text
    while start in rest:
        rest = rest.split(start, 1)[1]
        body, rest = rest.split(end, 1)
        out.append(body)
    return out


def main():
    cases = []
    for title, text in QWEN:
        calls = [qwen3_coder.parse_tool_call(body.strip(), TOOLS)
                 for body in inner(text, qwen3_coder.tool_call_start, qwen3_coder.tool_call_end)]
        cases.append({"format": "qwen3_coder", "title": title, "text": text, "calls": calls})
    for title, text in GEMMA:
        calls = []
        for body in inner(text, gemma4.tool_call_start, gemma4.tool_call_end):
            parsed = gemma4.parse_tool_call(body, TOOLS)
            calls.extend(parsed if isinstance(parsed, list) else [parsed])
        cases.append({"format": "gemma4", "title": title, "text": text, "calls": calls})
    OUT.write_text(json.dumps({"mlx_lm": "0.32.2", "tools": TOOLS, "cases": cases}, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
