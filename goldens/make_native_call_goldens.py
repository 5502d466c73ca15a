"""Native tool-call goldens: mlx-lm's own parsers on the models' raw call text.

Writes goldens/native_calls.json, read by tests/tokenizer_tool_templates.rs: for each case the
tools, the raw output as the model writes it (markers included) and the calls mlx-lm 0.32.2's
`tool_parsers` (qwen3_coder, gemma4, minicpm5, glm47, kimi_k2, pythonic) return for the text
between the markers (what mlx_lm.server hands them). The shapes follow the templates in
goldens/templates/ and llama.cpp's test vectors (tests/test-chat.cpp, llama-cpp-python 0.3.36).
Weft's streaming parsers (core/src/tools/native/) must give the same names and the same
argument values. (mlx-lm has no DeepSeek V3.1 or harmony parser: those are checked against
llama.cpp's vectors in core/src/tools/native/tests.rs.)

    .venv/bin/python goldens/make_native_call_goldens.py

Pinned: mlx-lm 0.32.2 (scripts/requirements-oracle.txt). Deterministic.
"""

import json
from pathlib import Path

from mlx_lm.tool_parsers import gemma4, glm47, kimi_k2, minicpm5, pythonic, qwen3_coder

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

MINICPM5 = [
    ("one string", '<function name="get_forecast"><param name="city">Paris</param></function>'),
    ("typed values", '<function name="get_forecast"><param name="city">Oslo</param><param name="days">3</param>'
     '<param name="metric">true</param><param name="ratio">0.5</param><param name="hours">[1, 2, 3]</param>'
     '<param name="where">{"lat": 59.9, "lon": 10.7}</param></function>'),
    ("a string that looks like a number", '<function name="get_forecast"><param name="city">42</param></function>'),
    # (A CDATA value holding `</param>` is llama.cpp's vector, in core/src/tools/native/tests.rs:
    # mlx-lm's regex ends the value there.)
    ("multi-line code in CDATA", '<function name="write_file"><param name="path">src/main.rs</param>'
     '<param name="content"><![CDATA[fn main() {\n    println!("<hi> & bye");\n}]]></param></function>'),
    ("two calls", '<function name="get_forecast"><param name="city">Paris</param></function>\n'
     '<function name="write_file"><param name="path">a.txt</param><param name="content">x</param></function>'),
    ("no parameters", '<function name="get_forecast"></function>'),
]

GLM = [
    ("one string (4.7)", "<tool_call>get_forecast<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"),
    ("typed values (4.7)", "<tool_call>get_forecast<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
     "<arg_key>days</arg_key><arg_value>3</arg_value><arg_key>metric</arg_key><arg_value>true</arg_value>"
     "<arg_key>ratio</arg_key><arg_value>0.5</arg_value><arg_key>hours</arg_key><arg_value>[1, 2, 3]</arg_value>"
     "<arg_key>where</arg_key><arg_value>{\"lat\": 59.9, \"lon\": 10.7}</arg_value></tool_call>"),
    ("newlines between tags (4.5 / 4.6)", "<tool_call>get_forecast\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n"
     "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"),
    ("a string that looks like a number", "<tool_call>get_forecast<arg_key>city</arg_key><arg_value>42</arg_value></tool_call>"),
    ("multi-line code", "<tool_call>write_file<arg_key>path</arg_key><arg_value>src/main.rs</arg_value>"
     "<arg_key>content</arg_key><arg_value>fn main() {\n    println!(\"<hi> & bye\");\n}</arg_value></tool_call>"),
    ("two calls", "<tool_call>get_forecast<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
     "<tool_call>write_file<arg_key>path</arg_key><arg_value>a.txt</arg_value><arg_key>content</arg_key><arg_value>x</arg_value></tool_call>"),
]

KIMI = [
    ("one call", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_forecast:0<|tool_call_argument_begin|>"
     "{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>"),
    ("typed values", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_forecast:3<|tool_call_argument_begin|>"
     "{\"city\": \"Oslo\", \"days\": 3, \"metric\": true, \"ratio\": 0.5, \"hours\": [1, 2, 3], \"where\": {\"lat\": 59.9}}"
     "<|tool_call_end|><|tool_calls_section_end|>"),
    ("two calls", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_forecast:0<|tool_call_argument_begin|>"
     "{\"city\":\"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.write_file:1<|tool_call_argument_begin|>"
     "{\"path\": \"a.txt\", \"content\": \"line 1\\nline 2\"}<|tool_call_end|><|tool_calls_section_end|>"),
]

PYTHONIC = [
    ("one string", '<|tool_call_start|>[get_forecast(city="Paris")]<|tool_call_end|>'),
    ("typed values", '<|tool_call_start|>[get_forecast(city="Oslo", days=3, metric=True, ratio=0.5, hours=[1, 2, 3], '
     'where={"lat": 59.9, "lon": 10.7}, note=None)]<|tool_call_end|>'),
    ("single quotes and escapes", "<|tool_call_start|>[write_file(path='a.txt', content='it\\'s \"x\"\\nline 2')]<|tool_call_end|>"),
    ("JSON literals", '<|tool_call_start|>[get_forecast(where={"ok": true, "none": null})]<|tool_call_end|>'),
    ("two calls", '<|tool_call_start|>[get_forecast(city="Paris"), write_file(path="a.txt", content="x")]<|tool_call_end|>'),
    ("no arguments", "<|tool_call_start|>[get_forecast()]<|tool_call_end|>"),
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
    # Parsers that return one call or a list for a region (several calls in one region).
    for fmt, module, cases_of in [("minicpm5", minicpm5, MINICPM5), ("glm", glm47, GLM), ("kimi_k2", kimi_k2, KIMI),
                                  ("pythonic", pythonic, PYTHONIC)]:
        for title, text in cases_of:
            calls = []
            for body in inner(text, module.tool_call_start, module.tool_call_end):
                parsed = module.parse_tool_call(body, TOOLS)
                for call in parsed if isinstance(parsed, list) else [parsed]:
                    calls.append({"name": call["name"], "arguments": call["arguments"]})
            cases.append({"format": fmt, "title": title, "text": text, "calls": calls})
    OUT.write_text(json.dumps({"mlx_lm": "0.32.2", "tools": TOOLS, "cases": cases}, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
