//! The JSON documents the C ABI accepts, engine options and requests: text → JSON value →
//! [`weft::contract`] (snake_case keys), whose errors become `WEFT_ERR_INVALID_ARGUMENT` with the
//! contract's message. The schema, its checks and their wording live there, shared with every
//! other face.

use serde_json::Value;
use weft::contract::{self, EngineOptions, Spelling};
use weft::engine::Request;

use crate::status::{from_engine_error, FfiResult};

fn parse_json(text: &str) -> FfiResult<Value> {
    serde_json::from_str(text)
        .map_err(|e| from_engine_error(&weft::Error::InvalidRequest(format!("malformed JSON: {e}")), false))
}

/// `weft_engine_new`'s options.
pub(crate) fn parse_options(text: &str) -> FfiResult<EngineOptions> {
    contract::parse_engine_options(&parse_json(text)?, Spelling::Snake).map_err(|e| from_engine_error(&e, false))
}

/// `weft_submit`'s request.
pub(crate) fn parse_request(text: &str, local: &weft::vision::source::LocalMedia) -> FfiResult<Request> {
    contract::parse_request_with(&parse_json(text)?, Spelling::Snake, local).map_err(|e| from_engine_error(&e, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::WEFT_ERR_INVALID_ARGUMENT;

    fn err(r: FfiResult<impl Sized>) -> String {
        let f = r.err().expect("expected an error");
        assert_eq!(f.status, WEFT_ERR_INVALID_ARGUMENT, "{}", f.message);
        f.message
    }

    fn parse_request_any(text: &str) -> FfiResult<Request> {
        parse_request(text, &Default::default())
    }

    // The contract's own tests cover every field; these check the text layer and the status.
    #[test]
    fn text_is_parsed_and_errors_are_invalid_argument() {
        let r = parse_request_any(r#"{"prompt_ids":[1,2],"max_tokens":4,"logprobs":true,"top_logprobs":2}"#).unwrap();
        assert_eq!((r.max_tokens, r.logprobs), (4, Some(2)));
        let o = parse_options(r#"{"model":"m","max_batch":2,"memory_limit_bytes":1000}"#).unwrap();
        assert_eq!((o.config.max_batch, o.config.memory.memory_limit_bytes), (2, Some(1000)));
        assert!(parse_options("{}").unwrap().model.is_none());

        assert!(err(parse_request_any("{")).starts_with("invalid request: malformed JSON"));
        assert!(err(parse_request_any("[]")).contains("the request must be an object, got []"));
        assert!(err(parse_request_any(r#"{"prompt":"a","maxTokens":1}"#)).contains("did you mean max_tokens?"));
        assert!(err(parse_request_any(r#"{"prompt":"a","max_tokens":"7"}"#)).contains("max_tokens must be an integer"));
        assert!(err(parse_options("nul")).contains("malformed JSON"));
        assert!(err(parse_options(r#"{"max_batchh":2}"#)).contains("unknown field \"max_batchh\""));
    }

    #[test]
    fn local_media_policy_applies_to_requests() {
        use weft::vision::source::LocalMedia;
        let o = parse_options(r#"{"local_media":"deny"}"#).unwrap();
        assert_eq!(o.config.local_media, LocalMedia::Deny);
        assert_eq!(parse_options("{}").unwrap().config.local_media, LocalMedia::Any);
        let m = err(parse_request(r#"{"prompt":"a","images":["/etc/passwd"]}"#, &o.config.local_media));
        assert!(m.contains("images[0]: image: local media paths are not allowed"), "{m}");
    }
}
