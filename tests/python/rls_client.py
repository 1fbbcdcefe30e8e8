"""A second, independent client of ratewatch's decision service: the code
Envoy's own API generates for Python (PyPI xds-protos) over grpcio.

    python rls_client.py HOST:PORT < plan.json

The plan is a JSON list of steps, each either
  {"health": "<service>"}                       grpc.health.v1.Health/Check
  {"domain": "...", "hits_addend": N,           RateLimitService/ShouldRateLimit
   "descriptors": [{"entries": [["k", "v"]], "hits_addend": N}]}
(the per-descriptor hits_addend is a UInt64Value: given, even 0, it is
sent). Prints one JSON list: per step {"health": "SERVING"}, {"response":
<RateLimitResponse as proto3 JSON, defaults included>} or {"error": "<gRPC
status code name>"}. The caller asserts; this file only speaks the wire.
"""
import json
import sys

import grpc
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc


def request(step):
    req = rls_pb2.RateLimitRequest(domain=step["domain"], hits_addend=step.get("hits_addend", 0))
    for d in step["descriptors"]:
        desc = req.descriptors.add()
        for key, value in d["entries"]:
            desc.entries.add(key=key, value=value)
        if "hits_addend" in d:
            # Present even when 0: "check, do not charge".
            desc.hits_addend.SetInParent()
            desc.hits_addend.value = d["hits_addend"]
    return req


def main():
    target = sys.argv[1]
    plan = json.load(sys.stdin)
    out = []
    with grpc.insecure_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        rls = rls_pb2_grpc.RateLimitServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        for step in plan:
            try:
                if "health" in step:
                    r = health.Check(health_pb2.HealthCheckRequest(service=step["health"]), timeout=10)
                    out.append({"health": health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)})
                else:
                    r = rls.ShouldRateLimit(request(step), timeout=10)
                    out.append(
                        {
                            "response": json_format.MessageToDict(
                                r,
                                preserving_proto_field_name=True,
                                always_print_fields_with_no_presence=True,
                            )
                        }
                    )
            except grpc.RpcError as e:
                out.append({"error": e.code().name})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
