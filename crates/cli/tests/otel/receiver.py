"""An OTLP/HTTP trace receiver for crates/cli/tests/otel.rs: decodes each
POST /v1/traces with the OpenTelemetry protobuf definitions from PyPI
(`opentelemetry-proto`) and writes every span it holds as one JSON line to
the file named by argv[1]. Prints its port on stdout once it listens.

A body that does not decode is answered 400 and written as an `undecodable`
line, so the test sees it rather than losing spans silently."""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

OUT = open(sys.argv[1], "a", buffering=1)
# One request's lines at a time: the server answers on a thread each.
LOCK = threading.Lock()


def value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    x = getattr(v, kind)
    if kind in ("array_value",):
        return [value(e) for e in x.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in x.values}
    if kind == "bytes_value":
        return x.hex()
    return x


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        if self.headers.get("Content-Length") is None:
            with LOCK:
                OUT.write(json.dumps({"undecodable": "no Content-Length"}) + "\n")
            self.send_response(411)
            self.end_headers()
            return
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path != "/v1/traces":
            self.send_response(404)
            self.end_headers()
            return
        try:
            req = ExportTraceServiceRequest.FromString(body)
        except Exception as e:  # noqa: BLE001 - any decoding failure is reported
            with LOCK:
                OUT.write(json.dumps({"undecodable": str(e)}) + "\n")
            self.send_response(400)
            self.end_headers()
            return
        lines = []
        for rs in req.resource_spans:
            resource = {kv.key: value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    lines.append(
                        json.dumps(
                            {
                                "service": resource.get("service.name"),
                                "scope": ss.scope.name,
                                "trace_id": s.trace_id.hex(),
                                "span_id": s.span_id.hex(),
                                "parent_span_id": s.parent_span_id.hex(),
                                "name": s.name,
                                "kind": s.kind,
                                "start_ns": s.start_time_unix_nano,
                                "end_ns": s.end_time_unix_nano,
                                "attributes": {kv.key: value(kv.value) for kv in s.attributes},
                                "status_code": s.status.code,
                                "status_message": s.status.message,
                            }
                        )
                        + "\n"
                    )
        with LOCK:
            OUT.write("".join(lines))
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
