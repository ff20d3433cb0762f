"""An agent's own HTTP client: run inside an agent, it sends each request of
REQUESTS.json to the API on $BROOD_SOCKET (so the supervisor identifies it as
that agent from its credentials) and writes the answers to OUT.json.

    as_agent.py REQUESTS.json OUT.json

A request with "wait_for": PATH is sent once PATH exists (at most 60 s).
"""

import http.client
import json
import os
import socket
import sys
import time
import urllib.parse


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("brood", timeout=30)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.unix_path)
        self.sock = s


def main():
    requests = json.load(open(sys.argv[1]))
    out = []
    for r in requests:
        # A request may wait for the test to say "now" (a file appearing).
        if r.get("wait_for"):
            waited = 0
            while not os.path.exists(r["wait_for"]) and waited < 600:
                time.sleep(0.1)
                waited += 1
        c = UnixConnection(os.environ["BROOD_SOCKET"])
        body = None if r.get("body") is None else json.dumps(r["body"])
        c.request(r["method"], r["path"], body=body, headers={"Content-Type": "application/json"})
        resp = c.getresponse()
        out.append(
            {
                "method": r["method"],
                "path": urllib.parse.urlsplit(r["path"]).path,
                "query": dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(r["path"]).query)),
                "template": r["template"],
                "status": resp.status,
                "content_type": resp.getheader("content-type", ""),
                "body": resp.read().decode(),
            }
        )
        c.close()
    json.dump(out, open(sys.argv[2], "w"))
    print(f"{len(out)} requests")


main()
