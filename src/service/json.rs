//! The proto3 JSON mapping of a `RateLimitRequest` and `RateLimitResponse`
//! (envoyproxy/ratelimit's `POST /json`).
//!
//! Input accepts what proto3 JSON parsers accept: lowerCamelCase or the
//! original field names, 64-bit and 32-bit integers as numbers or strings,
//! enums by name or number, a wrapper (`hitsAddend` of a descriptor) as its
//! bare value. Output is what a proto3 JSON printer writes: camelCase,
//! enum names, default values left out, a `Duration` as `"<seconds>s"`.

use serde_json::{Map, Value, json};

use super::proto::Unit;
use super::request::{LimitOverride, RlsAnswer, RlsDescriptor, RlsRequest};

/// Why a JSON request was refused (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid RateLimitRequest JSON: {0}")]
pub struct JsonError(pub String);

fn err(msg: impl Into<String>) -> JsonError {
    JsonError(msg.into())
}

/// The field named `camel` or `snake`; an error if both are given.
fn field<'a>(
    obj: &'a Map<String, Value>,
    camel: &str,
    snake: &str,
) -> Result<Option<&'a Value>, JsonError> {
    match (obj.get(camel), obj.get(snake)) {
        (Some(_), Some(_)) if camel != snake => {
            Err(err(format!("both {camel:?} and {snake:?} are given")))
        }
        (Some(v), _) | (None, Some(v)) => Ok((!v.is_null()).then_some(v)),
        (None, None) => Ok(None),
    }
}

/// Refuses a field of `obj` that is none of `fields` (each in its
/// lowerCamelCase and original spelling), naming it, as a proto3 JSON
/// parser refuses an unknown field: a misspelt `hitsAdend` must not pass
/// for a request that charges the default.
fn known(obj: &Map<String, Value>, what: &str, fields: &[&str]) -> Result<(), JsonError> {
    match obj.keys().find(|k| !fields.contains(&k.as_str())) {
        Some(k) => Err(err(format!(
            "unknown field {k:?} in {what} (known: {})",
            fields.join(", ")
        ))),
        None => Ok(()),
    }
}

fn uint(v: &Value, name: &str, max: u64) -> Result<u64, JsonError> {
    let n = match v {
        Value::Number(n) => n.as_u64().or_else(|| {
            // Proto3 JSON allows an integral float such as 3.0.
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .map(|f| f as u64)
        }),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    }
    .ok_or_else(|| err(format!("{name} must be an unsigned integer")))?;
    if n > max {
        return Err(err(format!("{name} is out of range")));
    }
    Ok(n)
}

fn string(v: &Value, name: &str) -> Result<String, JsonError> {
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| err(format!("{name} must be a string")))
}

fn object<'a>(v: &'a Value, name: &str) -> Result<&'a Map<String, Value>, JsonError> {
    v.as_object()
        .ok_or_else(|| err(format!("{name} must be an object")))
}

fn unit(v: &Value) -> Result<Unit, JsonError> {
    match v {
        Value::String(s) => Unit::from_json_name(s),
        Value::Number(n) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .and_then(|n| Unit::try_from(n).ok()),
        _ => None,
    }
    .ok_or_else(|| err("limit.unit must be a unit name (SECOND .. YEAR) or number"))
}

/// Parses a `RateLimitRequest` in proto3 JSON.
pub fn request_from_json(body: &[u8]) -> Result<RlsRequest, JsonError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| err(e.to_string()))?;
    let obj = object(&v, "the request")?;
    known(
        obj,
        "the request",
        &["domain", "descriptors", "hitsAddend", "hits_addend"],
    )?;
    let domain = field(obj, "domain", "domain")?
        .map(|v| string(v, "domain"))
        .transpose()?
        .unwrap_or_default();
    let hits_addend = field(obj, "hitsAddend", "hits_addend")?
        .map(|v| uint(v, "hitsAddend", u64::from(u32::MAX)))
        .transpose()?
        .unwrap_or(0) as u32;
    let mut descriptors = Vec::new();
    if let Some(list) = field(obj, "descriptors", "descriptors")? {
        let list = list
            .as_array()
            .ok_or_else(|| err("descriptors must be an array"))?;
        for d in list {
            descriptors.push(descriptor(object(d, "a descriptor")?)?);
        }
    }
    Ok(RlsRequest {
        domain,
        descriptors,
        hits_addend,
    })
}

fn descriptor(obj: &Map<String, Value>) -> Result<RlsDescriptor, JsonError> {
    known(
        obj,
        "a descriptor",
        &["entries", "limit", "hitsAddend", "hits_addend"],
    )?;
    let mut entries = Vec::new();
    if let Some(list) = field(obj, "entries", "entries")? {
        let list = list
            .as_array()
            .ok_or_else(|| err("entries must be an array"))?;
        for e in list {
            let e = object(e, "an entry")?;
            known(e, "an entry", &["key", "value"])?;
            let key = field(e, "key", "key")?
                .map(|v| string(v, "key"))
                .transpose()?
                .unwrap_or_default();
            let value = field(e, "value", "value")?
                .map(|v| string(v, "value"))
                .transpose()?
                .unwrap_or_default();
            entries.push((key, value));
        }
    }
    let limit = field(obj, "limit", "limit")?
        .map(|l| -> Result<Option<LimitOverride>, JsonError> {
            let l = object(l, "limit")?;
            known(
                l,
                "limit",
                &["requestsPerUnit", "requests_per_unit", "unit"],
            )?;
            let rpu = field(l, "requestsPerUnit", "requests_per_unit")?
                .map(|v| uint(v, "requestsPerUnit", u64::from(u32::MAX)))
                .transpose()?
                .unwrap_or(0) as u32;
            let u = field(l, "unit", "unit")?
                .map(unit)
                .transpose()?
                .unwrap_or(Unit::Unknown);
            // As on the wire: an override without a unit cannot be timed.
            Ok((u != Unit::Unknown).then_some(LimitOverride {
                requests_per_unit: rpu,
                unit: u,
            }))
        })
        .transpose()?
        .flatten();
    let hits_addend = field(obj, "hitsAddend", "hits_addend")?
        .map(|v| uint(v, "descriptor hitsAddend", u64::MAX))
        .transpose()?;
    Ok(RlsDescriptor {
        entries,
        limit,
        hits_addend,
    })
}

/// The answer as proto3 JSON.
pub fn response_to_json(a: &RlsAnswer) -> Value {
    let code = |over: bool| if over { "OVER_LIMIT" } else { "OK" };
    let statuses: Vec<Value> = a
        .statuses
        .iter()
        .map(|s| {
            let mut o = Map::new();
            o.insert("code".into(), json!(code(s.over_limit)));
            if let Some(l) = &s.current_limit {
                let mut cl = Map::new();
                if l.requests_per_unit != 0 {
                    cl.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
                }
                if l.unit != Unit::Unknown {
                    cl.insert("unit".into(), json!(l.unit.json_name()));
                }
                if !l.name.is_empty() {
                    cl.insert("name".into(), json!(l.name));
                }
                o.insert("currentLimit".into(), Value::Object(cl));
                o.insert(
                    "durationUntilReset".into(),
                    json!(format!("{}s", s.duration_until_reset.as_secs())),
                );
            }
            if s.limit_remaining != 0 {
                o.insert("limitRemaining".into(), json!(s.limit_remaining));
            }
            Value::Object(o)
        })
        .collect();
    let mut out = Map::new();
    out.insert("overallCode".into(), json!(code(a.over_limit)));
    if !statuses.is_empty() {
        out.insert("statuses".into(), Value::Array(statuses));
    }
    if !a.response_headers.is_empty() {
        let headers: Vec<Value> = a
            .response_headers
            .iter()
            .map(|(k, v)| json!({"key": k, "value": v}))
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    if let Some(m) = &a.dynamic_metadata {
        // proto3 JSON writes a `google.protobuf.Struct` as the object.
        out.insert("dynamicMetadata".into(), m.clone());
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camel_case_snake_case_and_strings_for_integers_are_accepted() {
        let camel =
            br#"{"domain":"d","hitsAddend":"2","descriptors":[{"entries":[{"key":"k","value":"v"}],
            "limit":{"requestsPerUnit":"5","unit":"MINUTE"},"hitsAddend":"0"}]}"#;
        let snake =
            br#"{"domain":"d","hits_addend":2,"descriptors":[{"entries":[{"key":"k","value":"v"}],
            "limit":{"requests_per_unit":5,"unit":2},"hits_addend":0}]}"#;
        let a = request_from_json(camel).unwrap();
        assert_eq!(a, request_from_json(snake).unwrap());
        assert_eq!(a.hits_addend, 2);
        assert_eq!(a.descriptors[0].hits_addend, Some(0));
        assert_eq!(
            a.descriptors[0].limit,
            Some(LimitOverride {
                requests_per_unit: 5,
                unit: Unit::Minute
            })
        );
    }

    #[test]
    fn hostile_json_is_an_error_not_a_panic() {
        for bad in [
            &b"["[..],
            b"[]",
            br#"{"domain":1}"#,
            br#"{"descriptors":{}}"#,
            br#"{"hitsAddend":-1}"#,
            br#"{"hitsAddend":"99999999999"}"#,
            br#"{"descriptors":[{"limit":{"unit":"FORTNIGHT"}}]}"#,
            br#"{"hitsAddend":1,"hits_addend":2}"#,
        ] {
            assert!(
                request_from_json(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_answer_prints_as_proto3_json() {
        use crate::service::request::{CurrentLimit, RlsStatus};
        let a = RlsAnswer {
            over_limit: true,
            statuses: vec![
                RlsStatus::default(),
                RlsStatus {
                    over_limit: true,
                    current_limit: Some(CurrentLimit {
                        requests_per_unit: 3,
                        unit: Unit::Minute,
                        name: String::new(),
                    }),
                    limit_remaining: 0,
                    duration_until_reset: std::time::Duration::from_secs(7),
                },
            ],
            response_headers: vec![],
            dynamic_metadata: None,
        };
        assert_eq!(
            response_to_json(&a),
            json!({"overallCode":"OVER_LIMIT","statuses":[{"code":"OK"},
                {"code":"OVER_LIMIT","currentLimit":{"requestsPerUnit":3,"unit":"MINUTE"},
                 "durationUntilReset":"7s"}]})
        );
    }
}
