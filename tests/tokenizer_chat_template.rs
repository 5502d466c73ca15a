//! Chat template rendering against transformers' own renderer (recorded in
//! tests/fixtures/smollm2_tokenizer.json), plus the helpers templates rely on.

mod tokenizer_support;

use weft::tokenizer::{ChatMessage, ChatTemplate};
use weft::Error;

fn messages(json: &serde_json::Value) -> Vec<ChatMessage> {
    serde_json::from_value(json.clone()).expect("messages")
}

fn render(source: &str, messages: &[ChatMessage]) -> weft::Result<String> {
    ChatTemplate::new(source, Some("<s>".into()), Some("</s>".into()))?.render(messages, false)
}

fn user(content: &str) -> Vec<ChatMessage> {
    vec![ChatMessage::new("user", content)]
}

#[test]
fn smollm2_template_matches_transformers() {
    let fixture = tokenizer_support::fixture();
    let special = &fixture["special"];
    let template = ChatTemplate::new(
        fixture["chat_template"].as_str().unwrap(),
        special["bos_token"].as_str().map(str::to_string),
        special["eos_token"].as_str().map(str::to_string),
    )
    .unwrap();
    let chats = fixture["chats"].as_array().unwrap();
    assert!(!chats.is_empty());
    for chat in chats {
        let rendered =
            template.render(&messages(&chat["messages"]), chat["add_generation_prompt"].as_bool().unwrap()).unwrap();
        assert_eq!(rendered, chat["text"].as_str().unwrap(), "{chat}");
    }
}

#[test]
fn feature_templates_match_transformers() {
    let fixture = tokenizer_support::fixture();
    let sources = &fixture["template_sources"];
    let cases = fixture["templates"].as_array().unwrap();
    assert!(cases.len() >= 40);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let template =
            ChatTemplate::new(sources[name].as_str().unwrap(), Some("<s>".into()), Some("</s>".into())).unwrap();
        let result = template.render(&messages(&case["messages"]), case["add_generation_prompt"].as_bool().unwrap());
        match (&case["text"], &case["error"]) {
            (serde_json::Value::String(expected), _) => {
                assert_eq!(result.unwrap_or_else(|e| panic!("{name}: {e}")), *expected, "{name}: {case}")
            }
            (_, serde_json::Value::String(expected)) => match result {
                Err(Error::Tokenizer(message)) => assert_eq!(&message, expected, "{name}"),
                other => panic!("{name}: expected the template to raise {expected:?}, got {other:?}"),
            },
            _ => panic!("fixture case has neither text nor error: {case}"),
        }
    }
}

#[test]
fn raise_exception_message_reaches_the_caller() {
    let err = render("{{ raise_exception('Only user and assistant roles are supported!') }}", &user("x")).unwrap_err();
    assert_eq!(err.to_string(), "tokenizer error: Only user and assistant roles are supported!");
}

#[test]
fn syntax_and_runtime_errors_are_tokenizer_errors() {
    let err = ChatTemplate::new("{% for %}", None, None).unwrap_err();
    assert!(matches!(&err, Error::Tokenizer(m) if m.starts_with("invalid chat template")), "{err}");
    let err = render("\n{{ messages[0].content.no_such_method() }}", &user("x")).unwrap_err();
    assert!(
        matches!(&err, Error::Tokenizer(m) if m.starts_with("chat template failed") && m.contains("no_such_method") && m.contains(":2)")),
        "{err}"
    );
}

#[test]
fn missing_special_tokens_stay_undefined() {
    let template =
        ChatTemplate::new("[{{ bos_token }}|{{ bos_token is defined }}|{{ eos_token }}]", None, Some("E".into()))
            .unwrap();
    assert_eq!(template.render(&user("x"), false).unwrap(), "[|False|E]");
}

#[test]
fn strftime_now_formats_the_local_date() {
    let rendered = render("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}", &user("x")).unwrap();
    let (iso, human) = rendered.split_once('|').unwrap();
    let year = &iso[..4];
    assert!(iso.len() == 10 && iso.as_bytes()[4] == b'-' && year.parse::<u32>().unwrap() >= 2024, "{iso}");
    assert!(human.ends_with(year), "{human}");
    assert!(
        matches!(render("{{ strftime_now('%Q') }}", &user("x")), Err(Error::Tokenizer(m)) if m.contains("strftime_now"))
    );
}

#[test]
fn tojson_prints_like_python_json_dumps() {
    let cases = [
        // Python: json.dumps(x, ensure_ascii=False) with transformers' defaults.
        (
            r#"{{ {"b": 1, "a": [1.5, true, none, "é\"<>&"]} | tojson }}"#,
            r#"{"b": 1, "a": [1.5, true, null, "é\"<>&"]}"#,
        ),
        (r#"{{ {"b": 1, "a": 2} | tojson(sort_keys=true) }}"#, r#"{"a": 2, "b": 1}"#),
        (r#"{{ [1, [], {}] | tojson(indent=2) }}"#, "[\n  1,\n  [],\n  {}\n]"),
        (r#"{{ {"k": [1, 2]} | tojson(indent=1) }}"#, "{\n \"k\": [\n  1,\n  2\n ]\n}"),
        (r#"{{ [1, 2] | tojson(separators=[",", ":"]) }}"#, "[1,2]"),
        (r#"{{ "é😀" | tojson(ensure_ascii=true) }}"#, r#""\u00e9\ud83d\ude00""#),
        (r#"{{ [1.0, 0.00001, 1e20, 2.5e-7, 123456.789] | tojson }}"#, "[1.0, 1e-05, 1e+20, 2.5e-07, 123456.789]"),
        (r#"{{ "tab\tnew\nline\u0001" | tojson }}"#, r#""tab\tnew\nline\u0001""#),
        (r#"{{ messages | tojson }}"#, r#"[{"role": "user", "content": "x"}]"#),
    ];
    for (source, expected) in cases {
        assert_eq!(render(source, &user("x")).unwrap(), expected, "{source}");
    }
}

#[test]
fn python_string_methods_and_loop_controls() {
    let source = "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}\
                  {% if m.role == 'system' %}{% continue %}{% endif %}\
                  {{ m.content.strip().title() }}/{{ m.content.split()|length }}/{{ m.content.lstrip().startswith('he') }};\
                  {% endfor %}";
    let messages = [
        ChatMessage::new("system", "ignored"),
        ChatMessage::new("user", "  hello there  "),
        ChatMessage::new("user", "never reached"),
    ];
    assert_eq!(render(source, &messages).unwrap(), "Hello There/2/True;");
}

#[test]
fn trim_and_lstrip_blocks_are_on() {
    let source = "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}\n";
    // Block tags take their line's indentation and trailing newline with them; the final
    // newline of the template is dropped, as Jinja2 does by default.
    assert_eq!(render(source, &user("x")).unwrap(), "x\n");
}

#[test]
fn generation_blocks_render_their_body() {
    let source =
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}\
                  {% else %}[{{ m.content }}]{%- generation -%}  {%- endgeneration -%}{% endif %}{% endfor %}";
    let messages = [ChatMessage::new("user", "q"), ChatMessage::new("assistant", "a")];
    assert_eq!(render(source, &messages).unwrap(), "[q]a");
}

#[test]
fn list_updates_on_a_namespace_work_as_in_python() {
    // Kimi K2's tool-history bookkeeping: ids appended per call, popped in order per result.
    let source = "{%- set q = namespace(ids=[]) -%}{%- for m in messages -%}\
                  {%- set _ = q.ids.append(m.content) -%}{%- endfor -%}\
                  {%- set first = q.ids.pop(0) -%}{{ first }}|{{ q.ids | join(',') }}";
    let messages = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b"), ChatMessage::new("user", "c")];
    assert_eq!(render(source, &messages).unwrap(), "a|b,c");
}

#[test]
fn tools_and_documents_are_none() {
    // Booleans print the Python way, as in Jinja2.
    let source = "{{ tools is none }} {{ documents is none }} {% if not tools %}no tools{% endif %}";
    assert_eq!(render(source, &user("x")).unwrap(), "True True no tools");
}
