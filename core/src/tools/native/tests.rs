//! The parsers on llama.cpp's test vectors and the templates' own shapes, streamed in every
//! split.

use super::gemma4::GEMMA_QUOTE;
use super::*;
use crate::tools::Assembler;

fn spec(name: &str, properties: Value) -> ToolSpec {
    let parameters = serde_json::json!({"type": "object", "properties": properties});
    ToolSpec { name: name.into(), description: None, parameters: parameters.clone(), raw: parameters }
}

fn specs() -> Vec<ToolSpec> {
    vec![
        spec("special_function", serde_json::json!({"arg1": {"type": "integer"}})),
        spec("special_function_with_opt", serde_json::json!({"arg1": {"type": "integer"}, "arg2": {"type": "integer"}})),
        spec("python", serde_json::json!({"code": {"type": "string"}})),
        spec("edit", serde_json::json!({"filename": {"type": "string"}, "oldString": {"type": "string"}, "newString": {"type": "string"}})),
        spec("get_time", serde_json::json!({"city": {"type": "string"}})),
        spec("get_weather", serde_json::json!({"city": {"type": "string"}})),
        spec("amount", serde_json::json!({"orig": {"type": "number"}})),
        spec("toggle", serde_json::json!({"enabled": {"type": "boolean"}})),
        spec("cfg", serde_json::json!({"opts": {"type": "object"}, "tags": {"type": "array"}, "n": {"type": "string"}})),
        spec("html", serde_json::json!({"markup": {"type": "string"}})),
        spec("set_config", serde_json::json!({"config": {"type": "object"}})),
        spec("set_nullable", serde_json::json!({"value": {"type": ["string", "null"]}})),
        spec("complex", serde_json::json!({"ref": {"type": "integer"}, "name": {"type": "string"}, "orig": {"type": "number"},
            "enabled": {"type": "boolean"}, "config": {"type": "object"}, "tags": {"type": "array"}})),
        spec("edit2", serde_json::json!({"oldString": {"type": "string"}, "newString": {"type": "string"}, "replaceAll": {"type": "boolean"}})),
    ]
}

/// Parses `text` whole, in pieces of every size from 1 to 7 chars, and split in two at every
/// boundary; asserts every way gives the same text and calls and that the deltas assemble to
/// the calls. Returns the text, (name, arguments) pairs and the completed count.
fn parse(format: NativeFormat, text: &str) -> (String, Vec<(String, String)>, usize) {
    let chars: Vec<char> = text.chars().collect();
    let mut ways: Vec<Vec<String>> = [chars.len().max(1), 1, 2, 3, 5, 7]
        .into_iter()
        .map(|step| chars.chunks(step).map(|p| p.iter().collect()).collect())
        .collect();
    ways.extend((0..=text.len()).filter(|i| text.is_char_boundary(*i)).map(|i| vec![text[..i].to_string(), text[i..].to_string()]));
    let mut first = None;
    for pieces in ways {
        let mut p = NativeCallParser::new(format, &specs());
        let mut out = String::new();
        let mut asm = Assembler::default();
        for piece in &pieces {
            let parsed = p.push(piece);
            out.push_str(&parsed.text);
            parsed.deltas.iter().for_each(|d| asm.apply(d));
        }
        let tail = p.finish();
        out.push_str(&tail.text);
        tail.deltas.iter().for_each(|d| asm.apply(d));
        assert_eq!(asm.calls, p.calls(), "deltas assemble to the calls ({pieces:?})");
        let calls: Vec<(String, String)> = p.calls().iter().map(|c| (c.name.clone(), c.arguments.clone())).collect();
        let got = (out, calls, p.completed_calls());
        match &first {
            None => first = Some(got),
            Some(f) => assert_eq!(&got, f, "{pieces:?}"),
        }
    }
    first.unwrap()
}

fn call(name: &str, args: &str) -> (String, String) {
    (name.into(), args.into())
}

// The native strings below are llama.cpp's test vectors (tests/test-chat.cpp in the
// llama-cpp-python 0.3.36 sdist) for these templates, with the arguments they expect.

#[test]
fn qwen3_coder_calls_typed_by_the_schema() {
    let text = "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(parse(NativeFormat::Qwen3Coder, text), (String::new(), vec![call("special_function", r#"{"arg1": 1}"#)], 1));
    let parallel = "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=special_function_with_opt>\n<parameter=arg1>\n1\n</parameter>\n<parameter=arg2>\n2\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(
        parse(NativeFormat::Qwen3Coder, parallel).1,
        vec![call("special_function", r#"{"arg1": 1}"#), call("special_function_with_opt", r#"{"arg1": 1, "arg2": 2}"#)]
    );
}

#[test]
fn qwen3_coder_multiline_string_values_are_kept() {
    let text = "<tool_call>\n<function=python>\n<parameter=code>\ndef hello():\n    print(\"Hello, world!\")\n\nhello()\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(
        parse(NativeFormat::Qwen3Coder, text).1,
        vec![call("python", "{\"code\": \"def hello():\\n    print(\\\"Hello, world!\\\")\\n\\nhello()\"}")]
    );
    let edit = "<tool_call>\n<function=edit>\n<parameter=filename>\nfoo.c\n</parameter>\n<parameter=oldString>\n#iclunde\n</parameter>\n<parameter=newString>\n#include\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(
        parse(NativeFormat::Qwen3Coder, edit).1,
        vec![call("edit", r##"{"filename": "foo.c", "oldString": "#iclunde", "newString": "#include"}"##)]
    );
    // A value that itself ends in a newline keeps it.
    let trailing = "<tool_call>\n<function=edit>\n<parameter=newString>\n#include\n\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(parse(NativeFormat::Qwen3Coder, trailing).1, vec![call("edit", "{\"newString\": \"#include\\n\"}")]);
}

#[test]
fn qwen3_coder_text_around_calls_and_cut_calls() {
    let (text, calls, done) = parse(NativeFormat::Qwen3Coder, "Let me check.\n<tool_call>\n<function=get_time>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n");
    assert_eq!((text.as_str(), done), ("Let me check.\n", 1));
    assert_eq!(calls, vec![call("get_time", r#"{"city": "Paris"}"#)]);
    // Cut by the token budget: the call is started but not completed.
    let (_, calls, done) = parse(NativeFormat::Qwen3Coder, "<tool_call>\n<function=get_time>\n<parameter=city>\nPar");
    assert_eq!((calls, done), (vec![call("get_time", "")], 0));
    // A region without a function is text.
    assert_eq!(parse(NativeFormat::Qwen3Coder, "a <tool_call>b</tool_call> c").0, "a <tool_call>b</tool_call> c");
    assert_eq!(parse(NativeFormat::Qwen3Coder, "just text <tool").0, "just text <tool");
    // No parameters.
    assert_eq!(parse(NativeFormat::Qwen3Coder, "<tool_call>\n<function=get_time>\n</function>\n</tool_call>").1, vec![call("get_time", "{}")]);
}

#[test]
fn values_that_do_not_fit_their_type_stay_text() {
    let text = "<tool_call>\n<function=cfg>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=tags>\n[\"x\"]\n</parameter>\n<parameter=n>\n12\n</parameter>\n<parameter=other>\n3\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(parse(NativeFormat::Qwen3Coder, text).1, vec![call("cfg", r#"{"opts": {"a": [1, 2]}, "tags": ["x"], "n": "12", "other": "3"}"#)]);
    let bad = "<tool_call>\n<function=special_function>\n<parameter=arg1>\nmany\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(parse(NativeFormat::Qwen3Coder, bad).1, vec![call("special_function", r#"{"arg1": "many"}"#)]);
}

#[test]
fn gemma4_calls() {
    let q = GEMMA_QUOTE;
    let one = format!("<|tool_call>call:get_time{{city:{q}London{q}}}<tool_call|>");
    assert_eq!(parse(NativeFormat::Gemma4, &one), (String::new(), vec![call("get_time", r#"{"city": "London"}"#)], 1));
    let with_text = format!("Hello, world!\nWhat's up?<|tool_call>call:get_time{{city:{q}Paris{q}}}<tool_call|>");
    assert_eq!(parse(NativeFormat::Gemma4, &with_text).0, "Hello, world!\nWhat's up?");
    assert_eq!(parse(NativeFormat::Gemma4, "<|tool_call>call:empty_args{}<tool_call|>").1, vec![call("empty_args", "{}")]);
    let parallel = format!("<|tool_call>call:get_time{{city:{q}London{q}}}<tool_call|><|tool_call>call:get_weather{{city:{q}Paris{q}}}<tool_call|>");
    assert_eq!(parse(NativeFormat::Gemma4, &parallel).1, vec![call("get_time", r#"{"city": "London"}"#), call("get_weather", r#"{"city": "Paris"}"#)]);
    assert_eq!(parse(NativeFormat::Gemma4, "<|tool_call>call:special_function{arg1:-7}<tool_call|>").1, vec![call("special_function", r#"{"arg1": -7}"#)]);
    assert_eq!(parse(NativeFormat::Gemma4, "<|tool_call>call:amount{orig:3.14}<tool_call|>").1, vec![call("amount", r#"{"orig": 3.14}"#)]);
    assert_eq!(parse(NativeFormat::Gemma4, "<|tool_call>call:toggle{enabled:true}<tool_call|>").1, vec![call("toggle", r#"{"enabled": true}"#)]);
    let nested = format!("<|tool_call>call:cfg{{opts:{{a:[1,{q}x, y{q}],b:null}},n:{q}1{q}}}<tool_call|>");
    assert_eq!(parse(NativeFormat::Gemma4, &nested).1, vec![call("cfg", r#"{"opts": {"a": [1, "x, y"], "b": null}, "n": "1"}"#)]);
    // Malformed or cut: text, no call.
    let (text, calls, _) = parse(NativeFormat::Gemma4, "<|tool_call>call:get_time{city:<tool_call|>");
    assert_eq!((text.as_str(), calls.len()), ("<|tool_call>call:get_time{city:<tool_call|>", 0));
    let (text, calls, _) = parse(NativeFormat::Gemma4, "<|tool_call>call:get_ti");
    assert_eq!((text.as_str(), calls.len()), ("<|tool_call>call:get_ti", 0));
}

#[test]
fn minicpm5_calls() {
    let f = NativeFormat::MiniCpm5;
    assert_eq!(
        parse(f, r#"<function name="python"><param name="code">print('Hello, World!')</param></function>"#),
        (String::new(), vec![call("python", r#"{"code": "print('Hello, World!')"}"#)], 1)
    );
    assert_eq!(parse(f, r#"<function name="empty_args"></function>"#).1, vec![call("empty_args", "{}")]);
    // CDATA lets a value hold what would close the tag.
    let cdata = r#"<function name="html"><param name="markup"><![CDATA[<a href="/x">hi</a> </param>]]></param></function>"#;
    assert_eq!(parse(f, cdata).1, vec![call("html", r#"{"markup": "<a href=\"/x\">hi</a> </param>"}"#)]);
    let cdata_end = "<function name=\"html\"><param name=\"markup\"><![CDATA[a\n</function>]]></param></function>";
    assert_eq!(parse(f, cdata_end).1, vec![call("html", r#"{"markup": "a\n</function>"}"#)]);
    let parallel = "<function name=\"python\"><param name=\"code\">print('x')</param></function>\n<function name=\"python\"><param name=\"code\">print('y')</param></function>";
    let (text, calls, done) = parse(f, parallel);
    assert_eq!((text.as_str(), done), ("", 2));
    assert_eq!(calls, vec![call("python", r#"{"code": "print('x')"}"#), call("python", r#"{"code": "print('y')"}"#)]);
    let typed = r#"Sure.<function name="complex"><param name="ref">42</param><param name="orig">2.5</param><param name="enabled">true</param><param name="name">7</param></function>"#;
    let (text, calls, _) = parse(f, typed);
    assert_eq!(text, "Sure.");
    assert_eq!(calls, vec![call("complex", r#"{"ref": 42, "orig": 2.5, "enabled": true, "name": "7"}"#)]);
    // Cut short: text, no call.
    let (text, calls, _) = parse(f, r#"<function name="python"><param name="code">pri"#);
    assert_eq!((text.as_str(), calls.len()), (r#"<function name="python"><param name="code">pri"#, 0));
}

#[test]
fn glm_calls() {
    let f = NativeFormat::Glm;
    // GLM 4.7: no whitespace; GLM 4.5 / 4.6: newlines between the tags.
    assert_eq!(
        parse(f, "<tool_call>special_function<arg_key>arg1</arg_key><arg_value>1</arg_value></tool_call>"),
        (String::new(), vec![call("special_function", r#"{"arg1": 1}"#)], 1)
    );
    assert_eq!(
        parse(f, "<tool_call>special_function\n<arg_key>arg1</arg_key>\n<arg_value>1</arg_value>\n</tool_call>").1,
        vec![call("special_function", r#"{"arg1": 1}"#)]
    );
    let parallel = "<tool_call>special_function<arg_key>arg1</arg_key><arg_value>1</arg_value></tool_call><tool_call>special_function_with_opt<arg_key>arg1</arg_key><arg_value>1</arg_value><arg_key>arg2</arg_key><arg_value>2</arg_value></tool_call>";
    assert_eq!(parse(f, parallel).1, vec![call("special_function", r#"{"arg1": 1}"#), call("special_function_with_opt", r#"{"arg1": 1, "arg2": 2}"#)]);
    let complex = "<tool_call>complex<arg_key>ref</arg_key><arg_value>42</arg_value><arg_key>name</arg_key><arg_value>上海</arg_value>\
                   <arg_key>orig</arg_key><arg_value>2.5</arg_value><arg_key>enabled</arg_key><arg_value>true</arg_value>\
                   <arg_key>config</arg_key><arg_value>{\"source\": \"spark\", \"options\": {\"strict\": true}}</arg_value>\
                   <arg_key>tags</arg_key><arg_value>[\"alpha\", \"测试\"]</arg_value></tool_call>";
    assert_eq!(
        parse(f, complex).1,
        vec![call("complex", r#"{"ref": 42, "name": "上海", "orig": 2.5, "enabled": true, "config": {"source": "spark", "options": {"strict": true}}, "tags": ["alpha", "测试"]}"#)]
    );
    // A string parameter keeps what looks like markup or a number.
    let tricky = "<tool_call>edit\n<arg_key>oldString</arg_key>\n<arg_value>contains </think> and <tool_call> strings</arg_value>\n<arg_key>newString</arg_key>\n<arg_value>1</arg_value>\n</tool_call>";
    assert_eq!(parse(f, tricky).1, vec![call("edit", r#"{"oldString": "contains </think> and <tool_call> strings", "newString": "1"}"#)]);
    assert_eq!(parse(f, "Checking.\n<tool_call>get_time<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>").0, "Checking.\n");
    assert_eq!(parse(f, "<tool_call>get_time</tool_call>").1, vec![call("get_time", "{}")]);
    // Not GLM's shape: text.
    assert_eq!(parse(f, "<tool_call>{\"name\": 1}</tool_call>").1, vec![]);
}

#[test]
fn kimi_calls() {
    let f = NativeFormat::KimiK2;
    let one = "<|tool_calls_section_begin|><|tool_call_begin|>functions.special_function:0<|tool_call_argument_begin|>{\"arg1\": 1}<|tool_call_end|><|tool_calls_section_end|>";
    assert_eq!(parse(f, one), (String::new(), vec![call("special_function", r#"{"arg1": 1}"#)], 1));
    let parallel = "Let me see.<|tool_calls_section_begin|>\n<|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>\n\
                    <|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{\"city\":\"Oslo\"}<|tool_call_end|>\n<|tool_calls_section_end|>";
    let (text, calls, done) = parse(f, parallel);
    assert_eq!((text.as_str(), done), ("Let me see.", 2));
    assert_eq!(calls, vec![call("get_time", r#"{"city": "Paris"}"#), call("get_weather", r#"{"city": "Oslo"}"#)]);
    // Cut short: the call is not delivered.
    let (_, calls, done) = parse(f, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{\"ci");
    assert_eq!((calls.len(), done), (0, 0));
}

#[test]
fn deepseek_calls() {
    let f = NativeFormat::DeepSeekV31;
    let one = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": \"XYZCITY\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    assert_eq!(parse(f, one), (String::new(), vec![call("get_time", r#"{"city": "XYZCITY"}"#)], 1));
    let parallel = "CONTENT<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    let (text, calls, _) = parse(f, parallel);
    assert_eq!(text, "CONTENT");
    assert_eq!(calls, vec![call("get_time", r#"{"city": "Paris"}"#), call("get_weather", r#"{"city": "Paris"}"#)]);
    // A number the model quoted is typed by the schema.
    assert_eq!(parse(f, "<｜tool▁call▁begin｜>special_function<｜tool▁sep｜>{\"arg1\": \"7\"}<｜tool▁call▁end｜>").1, vec![call("special_function", r#"{"arg1": 7}"#)]);
}

#[test]
fn pythonic_calls() {
    let f = NativeFormat::Pythonic;
    let p = |s: &str| parse(f, &format!("<|tool_call_start|>{s}<|tool_call_end|>")).1;
    assert_eq!(p("[special_function(arg1=1)]"), vec![call("special_function", r#"{"arg1": 1}"#)]);
    assert_eq!(p("[get_time(city=\"XYZCITY\")]"), vec![call("get_time", r#"{"city": "XYZCITY"}"#)]);
    assert_eq!(p("[toggle(enabled=True)]"), vec![call("toggle", r#"{"enabled": true}"#)]);
    assert_eq!(p("[set_nullable(value=None)]"), vec![call("set_nullable", r#"{"value": null}"#)]);
    assert_eq!(p("[set_config(config={\"enabled\": True, \"count\": 3})]"), vec![call("set_config", r#"{"config": {"enabled": true, "count": 3}}"#)]);
    assert_eq!(p("[set_config(config={\"enabled\": true, \"note\": null})]"), vec![call("set_config", r#"{"config": {"enabled": true, "note": null}}"#)]);
    assert_eq!(
        p("[Calendar.create_event(title=\"demo\", participants=[\"Alice\", \"Bob\"], metadata={\"priority\": \"high\", \"reminder\": true})]"),
        vec![call("Calendar.create_event", r#"{"title": "demo", "participants": ["Alice", "Bob"], "metadata": {"priority": "high", "reminder": true}}"#)]
    );
    assert_eq!(p("[python(code=\"def hello():\\n    print('hey')\")]"), vec![call("python", r#"{"code": "def hello():\n    print('hey')"}"#)]);
    assert_eq!(p("[python(code=\"First line\\nSecond line\\tindented\")]"), vec![call("python", r#"{"code": "First line\nSecond line\tindented"}"#)]);
    assert_eq!(p("[python(code=\"print(\\\"hi\\\")\")]"), vec![call("python", r#"{"code": "print(\"hi\")"}"#)]);
    assert_eq!(p("[python(code='it\\'s')]"), vec![call("python", r#"{"code": "it's"}"#)]);
    assert_eq!(
        p("[special_function(arg1=1), special_function_with_opt(arg1=1, arg2=2)]"),
        vec![call("special_function", r#"{"arg1": 1}"#), call("special_function_with_opt", r#"{"arg1": 1, "arg2": 2}"#)]
    );
    assert_eq!(p("[empty_args()]"), vec![call("empty_args", "{}")]);
    assert_eq!(p("[amount(orig=-2.5)]"), vec![call("amount", r#"{"orig": -2.5}"#)]);
    let (text, calls, _) = parse(f, "Let me check the time.<|tool_call_start|>[get_time(city=\"Paris\")]<|tool_call_end|>");
    assert_eq!((text.as_str(), calls), ("Let me check the time.", vec![call("get_time", r#"{"city": "Paris"}"#)]));
    // Markdown links stay text; a cut call is not delivered.
    let md = "Use this format: [link text](url). Example: [Wikipedia](https://www.wikipedia.org).";
    assert_eq!(parse(f, md), (md.to_string(), vec![], 0));
    let (_, calls, done) = parse(f, "<|tool_call_start|>[special_function(arg1=");
    assert_eq!((calls.len(), done), (0, 0));
}

#[test]
fn harmony_calls() {
    let f = NativeFormat::Harmony;
    // As the reasoning splitter passes call messages on (role header dropped).
    let one = "<|channel|>commentary to=functions.special_function <|constrain|>json<|message|>{\"arg1\": 1}<|call|>";
    assert_eq!(parse(f, one), (String::new(), vec![call("special_function", r#"{"arg1": 1}"#)], 1));
    // <|call|> is an end-of-turn token: the output may end without it.
    assert_eq!(parse(f, "<|channel|>commentary to=functions.special_function<|message|>{\"arg1\": 1}").1, vec![call("special_function", r#"{"arg1": 1}"#)]);
    // The recipient in the role header.
    assert_eq!(parse(f, "to=functions.special_function<|channel|>commentary json<|message|>{\"arg1\": 1}").1, vec![call("special_function", r#"{"arg1": 1}"#)]);
    let edit = "<|channel|>commentary to=functions.edit2 <|constrain|>json<|message|>{\"oldString\": \"if (part < railCount - 1) {\", \"newString\": \"if (part < 4) {\", \"replaceAll\": false}";
    assert_eq!(parse(f, edit).1, vec![call("edit2", r#"{"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {", "replaceAll": false}"#)]);
    // Cut short: no call.
    let (_, calls, done) = parse(f, "<|channel|>commentary to=functions.special_function <|constrain|>json<|message|>{\"arg1\": ");
    assert_eq!((calls.len(), done), (0, 0));
    assert_eq!(parse(f, "Plain answer.").0, "Plain answer.");
}
