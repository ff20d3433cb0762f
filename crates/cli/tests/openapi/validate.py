"""Checks brood's API against its own OpenAPI document with independent tools.

    validate.py SPEC.json EXCHANGES.json

1. openapi-spec-validator: the document is valid OpenAPI 3.1.
2. openapi-core: every recorded answer (status, content type, body) is one
   the document allows for its operation.
3. Coverage: every operation and every status the document names was
   exercised, and no answer had a status the document does not name.

Prints one line per problem and exits 1 if there is any.
"""

import json
import sys

from openapi_core import Config, OpenAPI
from openapi_core.testing import MockRequest, MockResponse
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate


def check_stream(spec, x, problems):
    """An event stream: its status and content type are documented for the
    operation, and each event's data is a brood `Event`."""
    op = spec["paths"][x["template"]][x["method"].lower()]
    documented = op["responses"].get(str(x["status"]), {}).get("content", {})
    if "text/event-stream" not in documented:
        problems.append(f"{x['method']} {x['path']} -> {x['status']}: text/event-stream not documented")
        return
    schema = dict(spec["components"]["schemas"]["Event"])
    schema["components"] = spec["components"]
    validator = OAS31Validator(schema)
    for line in x["body"].splitlines():
        if line.startswith("data: "):
            for err in validator.iter_errors(json.loads(line[6:])):
                problems.append(f"{x['path']}: an event is not an Event: {err.message[:300]}")


# Answers exercised by other tests, not here, and why.
ELSEWHERE = {
    # Placement on a node with labels: a cluster's (many_nodes_placement.rs).
    ("/api/agents", "post", "503"): "many_nodes_placement.rs",
    # A stream held as long as its session (raw requests here read to the
    # end): mcp.rs holds one with the MCP client; schemathesis.rs checks
    # each answer of it against the document.
    **{("/api/mcp/session", "post", s): "mcp.rs, schemathesis.rs" for s in ("200", "400", "403", "429", "503")},
}


def main() -> int:
    spec = json.load(open(sys.argv[1]))
    exchanges = json.load(open(sys.argv[2]))
    validate(spec)
    # Text media types openapi-core has no deserializer for (the job export's
    # CSV and JSON lines, and the UI's artifact downloads, text in the tests)
    # are read as the text they are.
    text = lambda b: b.decode("utf-8")
    config = Config(extra_media_type_deserializers={"text/csv": text, "application/x-ndjson": text, "application/octet-stream": text})
    api = OpenAPI.from_dict(spec, config=config)
    problems = []
    seen = set()
    for x in exchanges:
        op = (x["template"], x["method"].lower())
        seen.add((op, str(x["status"])))
        request = MockRequest(
            "http://brood",
            x["method"].lower(),
            x["path"],
            args=x.get("query") or {},
            headers={"Content-Type": "application/json"},
        )
        ctype = x["content_type"].split(";")[0].strip()
        if ctype == "text/event-stream":
            check_stream(spec, x, problems)
            continue
        body = x["body"].encode()
        response = MockResponse(body, status_code=x["status"], content_type=ctype)
        try:
            api.validate_response(request, response)
        except Exception as e:  # every failure is a finding
            detail = "; ".join(str(c) for c in getattr(e, "__cause__", None) and [e.__cause__] or [])
            problems.append(
                f"{x['method']} {x['path']} -> {x['status']}: {type(e).__name__}: {str(e)[:300]} {detail[:300]}\n    body: {x['body'][:300]}"
            )
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if method not in ("get", "post", "put", "delete", "patch"):
                continue
            for status, response in operation.get("responses", {}).items():
                if ((path, method), status) in seen or (path, method, status) in ELSEWHERE:
                    continue
                # The answers every route shares (authentication, a body's
                # and a key's refusals, a failed store), declared once under
                # components/responses: each comes from one piece of code,
                # exercised on the routes where this test provokes it.
                if response.get("$ref", "").startswith("#/components/responses/"):
                    continue
                problems.append(f"never exercised: {method.upper()} {path} -> {status}")
    for p in problems:
        print(p)
    print(f"{len(exchanges)} answers checked against {len(spec['paths'])} paths; {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
