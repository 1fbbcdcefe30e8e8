//! The wire messages of Envoy's rate limit service v3 and of gRPC health,
//! written by hand as prost messages.
//!
//! Why by hand: the build needs no `protoc` and no build script, and keeps
//! Rust 1.85 (the generated `envoy-types` crate needs a newer compiler).
//! Each message keeps its proto package's field numbers and types, so the
//! bytes are the ones Envoy 1.40 sends and reads. Fields ratewatch neither
//! reads nor writes are left out (`RateLimitResponse.raw_body`, `quota`,
//! `DescriptorStatus.quota`): prost skips
//! unknown fields on input, and an unset field is not on the wire anyway.
//! Every field Envoy sends in a request is here.
//!
//! Sources of the layout: `envoy/service/ratelimit/v3/rls.proto`,
//! `envoy/extensions/common/ratelimit/v3/ratelimit.proto`,
//! `envoy/type/v3/ratelimit_unit.proto`, `envoy/config/core/v3/base.proto`
//! (`HeaderValue`), `google/protobuf/{wrappers,duration,struct}.proto` and
//! `grpc/health/v1/health.proto`.

/// `envoy.service.ratelimit.v3.RateLimitRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitRequest {
    /// The domain the descriptors belong to.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// The descriptors, each decided; the request is over limit if any is.
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// Units every descriptor is charged; 0 means 1.
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// The descriptor's entries, outermost first.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    /// A limit given by the proxy instead of the configured one.
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// Units this descriptor is charged (`google.protobuf.UInt64Value`: an
    /// explicit 0 is visible and checks without charging).
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
}

/// `RateLimitDescriptor.Entry`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Entry {
    /// The key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitOverride {
    /// Requests per unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// `envoy.type.v3.RateLimitUnit` (see [`Unit`]).
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `google.protobuf.UInt64Value`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct UInt64Value {
    /// The value.
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `google.protobuf.Duration`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct Duration {
    /// Whole seconds.
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    /// Nanoseconds beyond them.
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResponse {
    /// [`Code`] of the whole request.
    #[prost(int32, tag = "1")]
    pub overall_code: i32,
    /// One per request descriptor, in request order.
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    /// Headers Envoy adds to the response to the client.
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
    /// Headers Envoy adds to the request sent upstream.
    #[prost(message, repeated, tag = "4")]
    pub request_headers_to_add: Vec<HeaderValue>,
    /// Filter metadata Envoy stores under `envoy.filters.http.ratelimit`
    /// (`[rls] response_dynamic_metadata`).
    #[prost(message, optional, tag = "6")]
    pub dynamic_metadata: Option<Struct>,
}

/// `google.protobuf.Struct`: a JSON object.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Struct {
    /// The object's members.
    #[prost(btree_map = "string, message", tag = "1")]
    pub fields: std::collections::BTreeMap<String, Value>,
}

/// `google.protobuf.Value`: one JSON value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    /// Which value; `None` reads as null.
    #[prost(oneof = "Kind", tags = "1, 2, 3, 4, 5, 6")]
    pub kind: Option<Kind>,
}

/// `google.protobuf.Value.kind`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Kind {
    /// `null` (`google.protobuf.NullValue`, always 0).
    #[prost(int32, tag = "1")]
    NullValue(i32),
    /// A number.
    #[prost(double, tag = "2")]
    NumberValue(f64),
    /// A string.
    #[prost(string, tag = "3")]
    StringValue(String),
    /// A boolean.
    #[prost(bool, tag = "4")]
    BoolValue(bool),
    /// An object.
    #[prost(message, tag = "5")]
    StructValue(Struct),
    /// An array.
    #[prost(message, tag = "6")]
    ListValue(ListValue),
}

/// `google.protobuf.ListValue`: a JSON array.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListValue {
    /// The items.
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<Value>,
}

impl Struct {
    /// The object `json` is (`None` for any other JSON value).
    pub fn from_json(json: &serde_json::Value) -> Option<Struct> {
        match Value::from_json(json).kind {
            Some(Kind::StructValue(s)) => Some(s),
            _ => None,
        }
    }

    /// The object as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.fields
                .iter()
                .map(|(k, v)| (k.clone(), v.to_json()))
                .collect(),
        )
    }
}

impl Value {
    /// `json` as a protobuf value (numbers as doubles, as JSON's are).
    pub fn from_json(json: &serde_json::Value) -> Value {
        use serde_json::Value as J;
        let kind = match json {
            J::Null => Kind::NullValue(0),
            J::Bool(b) => Kind::BoolValue(*b),
            J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
            J::String(s) => Kind::StringValue(s.clone()),
            J::Array(a) => Kind::ListValue(ListValue {
                values: a.iter().map(Value::from_json).collect(),
            }),
            J::Object(o) => Kind::StructValue(Struct {
                fields: o
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::from_json(v)))
                    .collect(),
            }),
        };
        Value { kind: Some(kind) }
    }

    /// The value as JSON (a whole double as an integer; a non-finite
    /// one, which JSON cannot hold, as null).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.kind {
            None | Some(Kind::NullValue(_)) => J::Null,
            Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9.0e15 => {
                J::from(*n as i64)
            }
            Some(Kind::NumberValue(n)) => {
                serde_json::Number::from_f64(*n).map_or(J::Null, J::Number)
            }
            Some(Kind::StringValue(s)) => J::String(s.clone()),
            Some(Kind::BoolValue(b)) => J::Bool(*b),
            Some(Kind::StructValue(s)) => s.to_json(),
            Some(Kind::ListValue(l)) => J::Array(l.values.iter().map(Value::to_json).collect()),
        }
    }
}

/// `RateLimitResponse.DescriptorStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DescriptorStatus {
    /// [`Code`] of this descriptor.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// The limit that applied, if any.
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    /// Requests left in the current unit.
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    /// Until the limit's quota is back.
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<Duration>,
}

/// `RateLimitResponse.RateLimit`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimit {
    /// Requests per unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// [`Unit`].
    #[prost(int32, tag = "2")]
    pub unit: i32,
    /// The limit's name, if configured.
    #[prost(string, tag = "3")]
    pub name: String,
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    /// Header name.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Header value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `RateLimitResponse.Code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Code {
    /// Not set.
    Unknown = 0,
    /// Under the limit.
    Ok = 1,
    /// Over the limit.
    OverLimit = 2,
}

/// `RateLimitResponse.RateLimit.Unit` (and, for 0..=6,
/// `envoy.type.v3.RateLimitUnit` of a request's override).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Unit {
    /// Not set.
    Unknown = 0,
    /// Second.
    Second = 1,
    /// Minute.
    Minute = 2,
    /// Hour.
    Hour = 3,
    /// Day.
    Day = 4,
    /// Month.
    Month = 5,
    /// Year.
    Year = 6,
    /// Week.
    Week = 7,
}

impl Unit {
    /// Seconds in one unit (a month is 30 days, a year 365, as
    /// envoyproxy/ratelimit counts them); `None` for `Unknown`.
    pub fn seconds(self) -> Option<u64> {
        Some(match self {
            Unit::Unknown => return None,
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        })
    }

    /// The proto3 JSON name (`SECOND`, ...).
    pub fn json_name(self) -> &'static str {
        match self {
            Unit::Unknown => "UNKNOWN",
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
            Unit::Week => "WEEK",
        }
    }

    /// From its proto3 JSON name.
    pub fn from_json_name(name: &str) -> Option<Self> {
        [
            Unit::Unknown,
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Month,
            Unit::Year,
            Unit::Week,
        ]
        .into_iter()
        .find(|u| u.json_name() == name)
    }
}

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckRequest {
    /// The service asked about; empty for the server as a whole.
    #[prost(string, tag = "1")]
    pub service: String,
}

/// `grpc.health.v1.HealthCheckResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckResponse {
    /// [`ServingStatus`].
    #[prost(int32, tag = "1")]
    pub status: i32,
}

/// `HealthCheckResponse.ServingStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ServingStatus {
    /// Unknown.
    Unknown = 0,
    /// Serving.
    Serving = 1,
    /// Not serving.
    NotServing = 2,
    /// The service is not known.
    ServiceUnknown = 3,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// A request as Envoy writes it, byte by byte: domain "edge", one
    /// descriptor {remote_address: 10.0.0.1} with an override of 5 per
    /// MINUTE and an explicit hits_addend of 0, request hits_addend 3.
    fn envoy_request_bytes() -> Vec<u8> {
        let mut entry = vec![0x0a, 14];
        entry.extend_from_slice(b"remote_address");
        entry.extend_from_slice(&[0x12, 8]);
        entry.extend_from_slice(b"10.0.0.1");
        let mut descriptor = vec![0x0a, entry.len() as u8];
        descriptor.extend_from_slice(&entry);
        // limit {requests_per_unit: 5, unit: MINUTE}
        descriptor.extend_from_slice(&[0x12, 4, 0x08, 5, 0x10, 2]);
        // hits_addend {} : a present wrapper holding the default 0
        descriptor.extend_from_slice(&[0x1a, 0]);
        let mut bytes = vec![0x0a, 4];
        bytes.extend_from_slice(b"edge");
        bytes.push(0x12);
        bytes.push(descriptor.len() as u8);
        bytes.extend_from_slice(&descriptor);
        bytes.extend_from_slice(&[0x18, 3]);
        // An unknown field (number 15, varint) is skipped.
        bytes.extend_from_slice(&[0x78, 1]);
        bytes
    }

    #[test]
    fn a_request_decodes_from_the_bytes_envoy_sends() {
        let r = RateLimitRequest::decode(&envoy_request_bytes()[..]).unwrap();
        assert_eq!(r.domain, "edge");
        assert_eq!(r.hits_addend, 3);
        let d = &r.descriptors[0];
        assert_eq!(d.entries[0].key, "remote_address");
        assert_eq!(d.entries[0].value, "10.0.0.1");
        let limit = d.limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (5, Unit::Minute as i32)
        );
        assert_eq!(d.hits_addend, Some(UInt64Value { value: 0 }));
    }

    #[test]
    fn an_absent_descriptor_addend_is_none_not_zero() {
        let bytes = [0x12, 0x04, 0x0a, 0x02, 0x0a, 0x00];
        let r = RateLimitRequest::decode(&bytes[..]).unwrap();
        assert_eq!(r.descriptors[0].hits_addend, None);
        assert_eq!(r.hits_addend, 0);
    }

    #[test]
    fn a_response_encodes_to_the_bytes_envoy_reads() {
        let response = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![DescriptorStatus {
                code: Code::OverLimit as i32,
                current_limit: Some(RateLimit {
                    requests_per_unit: 10,
                    unit: Unit::Second as i32,
                    name: "a".into(),
                }),
                limit_remaining: 0,
                duration_until_reset: Some(Duration {
                    seconds: 1,
                    nanos: 0,
                }),
            }],
            response_headers_to_add: vec![HeaderValue {
                key: "k".into(),
                value: "v".into(),
            }],
            request_headers_to_add: vec![],
            dynamic_metadata: None,
        };
        let status = [
            0x08, 2, // code OVER_LIMIT
            0x12, 7, 0x08, 10, 0x10, 1, 0x1a, 1, b'a', // current_limit
            // limit_remaining 0 is the default: not on the wire
            0x22, 2, 0x08, 1, // duration_until_reset 1 s
        ];
        let mut want = vec![0x08, 2, 0x12, status.len() as u8];
        want.extend_from_slice(&status);
        want.extend_from_slice(&[0x1a, 6, 0x0a, 1, b'k', 0x12, 1, b'v']);
        assert_eq!(response.encode_to_vec(), want);
    }

    #[test]
    fn dynamic_metadata_is_a_struct_in_field_six() {
        let json = serde_json::json!({"a": "b"});
        let response = RateLimitResponse {
            overall_code: Code::Ok as i32,
            dynamic_metadata: Struct::from_json(&json),
            ..RateLimitResponse::default()
        };
        // Struct{fields: {"a": Value{string_value: "b"}}}: a map entry
        // (key 1, value 2) of field 1.
        let entry = [0x0a, 1, b'a', 0x12, 3, 0x1a, 1, b'b'];
        let mut want = vec![0x08, 1, 0x32, 10, 0x0a, 8];
        want.extend_from_slice(&entry);
        assert_eq!(response.encode_to_vec(), want);
        let back = RateLimitResponse::decode(&want[..]).unwrap();
        assert_eq!(back.dynamic_metadata.unwrap().to_json(), json);
    }

    #[test]
    fn json_round_trips_through_struct() {
        let json = serde_json::json!({
            "s": "x", "n": 5, "f": 1.5, "b": true, "z": null,
            "l": [1, "two", {"three": [3]}], "o": {"p": {"q": false}}
        });
        let s = Struct::from_json(&json).unwrap();
        let back = Struct::decode(&s.encode_to_vec()[..]).unwrap();
        assert_eq!(back.to_json(), json);
        assert!(Struct::from_json(&serde_json::json!([1])).is_none());
    }

    #[test]
    fn health_messages_match_grpc_health_v1() {
        let req = HealthCheckRequest::decode(&[0x0a, 3, b'a', b'b', b'c'][..]).unwrap();
        assert_eq!(req.service, "abc");
        let resp = HealthCheckResponse {
            status: ServingStatus::Serving as i32,
        };
        assert_eq!(resp.encode_to_vec(), vec![0x08, 1]);
    }
}
