//! JSON patches whose `test` ops the API server can match.
//!
//! kube-apiserver applies a JSON patch to its own JSON encoding of the stored object, and the
//! `test` op compares a string value with that encoding byte for byte (after compaction, which
//! leaves escapes alone). Go's encoder writes `&`, `<`, `>`, U+2028 and U+2029 as `\u0026`,
//! `\u003c`, `\u003e`, `\u2028` and `\u2029`; serde_json writes them as they are. Any other string
//! both encode alike: `"` and `\` escaped, `\b \f \n \r \t` short, other control characters as
//! `\u00xx` in lowercase hex, everything else (non-ASCII too) literal. So a patch written by
//! [`to_vec`] holds every string exactly as the API server would write it, and a `test` op on
//! user-written text (a template annotation) applies when, and only when, the text is unchanged.
//! `tests/e2e_records.rs` checks this against the real API server over a generated corpus.

use std::io;

use kube::api::PatchParams;
use kube::core::Request;
use serde::Serialize;
use serde_json::json;
use serde_json::ser::{Formatter, Serializer};

use crate::error::{Error, Result};

/// Compact JSON with Go's HTML-safe escapes, as kube-apiserver encodes objects.
struct GoFormatter;

impl Formatter for GoFormatter {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut start = 0;
        for (at, c) in fragment.char_indices() {
            let escape = match c {
                '&' => "\\u0026",
                '<' => "\\u003c",
                '>' => "\\u003e",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[start..at])?;
            writer.write_all(escape.as_bytes())?;
            start = at + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }
}

/// `value` encoded as kube-apiserver encodes JSON.
pub fn to_vec(value: &impl Serialize) -> std::result::Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::new();
    value.serialize(&mut Serializer::with_formatter(&mut out, GoFormatter))?;
    Ok(out)
}

/// A JSON-patch request for `K` named `name` (in `ns` when namespaced), its body encoded by
/// [`to_vec`]. Send it with `Client::request`; errors come back as from `Api::patch`.
pub fn patch_request<K>(
    ns: Option<&str>,
    name: &str,
    ops: &impl Serialize,
    params: &PatchParams,
) -> Result<http::Request<Vec<u8>>>
where
    K: kube::Resource<DynamicType = ()>,
{
    let encode = |source| Error::Encode {
        what: "JSON patch",
        source,
    };
    let placeholder: json_patch::Patch = serde_json::from_value(json!([])).map_err(encode)?;
    let mut request = Request::new(K::url_path(&(), ns))
        .patch(name, params, &kube::api::Patch::<()>::Json(placeholder))
        .map_err(|source| Error::Request {
            what: "JSON patch request",
            source,
        })?;
    *request.body_mut() = to_vec(ops).map_err(encode)?;
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn go(value: &Value) -> String {
        String::from_utf8(to_vec(value).expect("encodes")).expect("utf-8")
    }

    #[test]
    fn escapes_what_go_escapes() {
        let text = "a && b <in >out \u{2028}\u{2029} é ✓ \t\n\r\u{8}\u{c}\u{1}\u{7f} \"q\" \\ /";
        assert_eq!(
            go(&json!(text)),
            "\"a \\u0026\\u0026 b \\u003cin \\u003eout \\u2028\\u2029 é ✓ \\t\\n\\r\\b\\f\\u0001\u{7f} \\\"q\\\" \\\\ /\""
        );
    }

    #[test]
    fn keys_and_nesting_too() {
        let value = json!([{"op": "test", "path": "/a", "value": {"<k>": ["x&y"]}}]);
        assert_eq!(
            go(&value),
            r#"[{"op":"test","path":"/a","value":{"\u003ck\u003e":["x\u0026y"]}}]"#
        );
    }

    #[test]
    fn decodes_to_the_same_value() {
        let value = json!({"s": "if [ a < b ] && c > d; then\u{2028}ok\u{2029}fi", "n": 3});
        let back: Value = serde_json::from_slice(&to_vec(&value).expect("encodes")).expect("json");
        assert_eq!(back, value);
    }

    #[test]
    fn request_carries_the_escaped_body() {
        let ops = vec![json!({"op": "test", "path": "/x", "value": "a&b"})];
        let request = patch_request::<k8s_openapi::api::apps::v1::StatefulSet>(
            Some("ns"),
            "web",
            &ops,
            &PatchParams::default(),
        )
        .expect("request");
        assert_eq!(request.method(), http::Method::PATCH);
        assert!(
            request
                .uri()
                .path()
                .ends_with("/namespaces/ns/statefulsets/web")
        );
        assert_eq!(
            request.headers()[http::header::CONTENT_TYPE],
            "application/json-patch+json"
        );
        assert_eq!(
            request.body().as_slice(),
            br#"[{"op":"test","path":"/x","value":"a\u0026b"}]"#
        );
    }
}
