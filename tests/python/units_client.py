"""A plain Python client of ratewatch's decision API, with nothing but the
standard library: for each of N completions it reserves an estimate of
tokens with POST /v1/decide, then settles what was used with POST
/v1/settle (twice for the first, to see the second change nothing).

usage: units_client.py BASE_URL API_KEY N ESTIMATE USED

Prints one JSON list of steps; the expectations live in tests/units_python.rs.
"""

import json
import sys
import urllib.error
import urllib.request


def post(base, path, body):
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as res:
            return res.status, json.loads(res.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def main():
    base, key, n, estimate, used = sys.argv[1:6]
    steps = []
    for i in range(int(n)):
        status, decided = post(
            base, "/v1/decide",
            {"key": key, "costs": {"tokens": int(estimate)}, "reserve": True},
        )
        step = {"decide_status": status, "decide": decided}
        reservation = decided.get("reservation") if isinstance(decided, dict) else None
        if reservation:
            settle = {"reservation": reservation, "used": {"tokens": int(used)}}
            step["settle"] = post(base, "/v1/settle", settle)
            if i == 0:
                step["settle_again"] = post(base, "/v1/settle", settle)
        steps.append(step)
    print(json.dumps(steps))


if __name__ == "__main__":
    main()
