//! Wire messages to the service's request, and its answer back.

use super::proto::{self, Code, Unit};
use super::request::{LimitOverride, RlsAnswer, RlsDescriptor, RlsRequest};

/// The request as the service reads it. An override with an unknown unit
/// is dropped (the configured limit applies), as a unit ratewatch cannot
/// time cannot be enforced.
pub fn request_from_wire(r: proto::RateLimitRequest) -> RlsRequest {
    RlsRequest {
        domain: r.domain,
        hits_addend: r.hits_addend,
        descriptors: r
            .descriptors
            .into_iter()
            .map(|d| RlsDescriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                limit: d.limit.and_then(|l| {
                    let unit = Unit::try_from(l.unit)
                        .ok()
                        .filter(|u| *u != Unit::Unknown)?;
                    Some(LimitOverride {
                        requests_per_unit: l.requests_per_unit,
                        unit,
                    })
                }),
                hits_addend: d.hits_addend.map(|v| v.value),
            })
            .collect(),
    }
}

/// The answer as Envoy reads it.
pub fn response_to_wire(a: &RlsAnswer) -> proto::RateLimitResponse {
    let code = |over: bool| if over { Code::OverLimit } else { Code::Ok } as i32;
    proto::RateLimitResponse {
        overall_code: code(a.over_limit),
        statuses: a
            .statuses
            .iter()
            .map(|s| proto::DescriptorStatus {
                code: code(s.over_limit),
                current_limit: s.current_limit.as_ref().map(|l| proto::RateLimit {
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit as i32,
                    name: l.name.clone(),
                }),
                limit_remaining: s.limit_remaining,
                duration_until_reset: s.current_limit.as_ref().map(|_| proto::Duration {
                    seconds: i64::try_from(s.duration_until_reset.as_secs()).unwrap_or(i64::MAX),
                    nanos: s.duration_until_reset.subsec_nanos() as i32,
                }),
            })
            .collect(),
        response_headers_to_add: a
            .response_headers
            .iter()
            .map(|(k, v)| proto::HeaderValue {
                key: k.clone(),
                value: v.clone(),
            })
            .collect(),
        request_headers_to_add: Vec::new(),
        dynamic_metadata: a
            .dynamic_metadata
            .as_ref()
            .and_then(proto::Struct::from_json),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prost::Message;

    use super::*;
    use crate::service::request::{CurrentLimit, RlsStatus};

    #[test]
    fn wire_bytes_become_the_request_the_service_reads() {
        // domain "d"; descriptor {k: v} with hits_addend {value: 0};
        // descriptor {a: b} with limit {7 per HOUR}; hits_addend 2.
        let bytes = [
            0x0a, 1, b'd', //
            0x12, 10, 0x0a, 6, 0x0a, 1, b'k', 0x12, 1, b'v', 0x1a, 0, //
            0x12, 14, 0x0a, 6, 0x0a, 1, b'a', 0x12, 1, b'b', 0x12, 4, 0x08, 7, 0x10, 3, //
            0x18, 2,
        ];
        let wire = proto::RateLimitRequest::decode(&bytes[..]).unwrap();
        let r = request_from_wire(wire);
        assert_eq!(r.domain, "d");
        assert_eq!(r.hits_addend, 2);
        assert_eq!(r.descriptors[0].entries, vec![("k".into(), "v".into())]);
        assert_eq!(r.descriptors[0].hits_addend, Some(0));
        assert_eq!(r.descriptors[0].limit, None);
        assert_eq!(
            r.descriptors[1].limit,
            Some(LimitOverride {
                requests_per_unit: 7,
                unit: Unit::Hour
            })
        );
        assert_eq!(r.descriptors[1].hits_addend, None);
    }

    #[test]
    fn the_answer_becomes_the_bytes_envoy_reads() {
        let answer = RlsAnswer {
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
                    duration_until_reset: Duration::from_secs(42),
                },
            ],
            response_headers: vec![],
            dynamic_metadata: None,
        };
        let bytes = response_to_wire(&answer).encode_to_vec();
        let want = [
            0x08, 2, // overall OVER_LIMIT
            0x12, 2, 0x08, 1, // status OK, nothing else
            0x12, 12, 0x08, 2, 0x12, 4, 0x08, 3, 0x10, 2, 0x22, 2, 0x08, 42,
        ];
        assert_eq!(bytes, want);
    }
}
