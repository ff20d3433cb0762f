"""schemathesis's hooks for brood's API (crates/cli/tests/schemathesis.rs).

`map_case` turns a request the document calls valid into one this test's
host can take, where validity depends on more than the document can say:
state the server keeps (an idempotency key already used, secret values
for the names a policy lists) or relations between fields (two file rules
for one path, a job's columns). It never touches a request generated to be
invalid. `filter_failure` drops only failures about this host: a request
valid by the document that names a program, directory or file that does
not exist here.
"""

import re
import uuid

import schemathesis
from schemathesis.core import NotSet

KEY = re.compile(r"^[!-~]{1,255}$")
VAR_NAME = re.compile(r"^(?!BROOD_|CTX_)[^=\s\x00-\x1f\x7f-\x9f]+$")


def _positive(case):
    meta = getattr(case, "meta", None)
    generation = getattr(meta, "generation", None)
    mode = getattr(generation, "mode", None)
    return mode is not None and getattr(mode, "is_positive", False)


def _norm(path):
    """A path as the server compares it (`AbsPath`): no repeated or trailing `/`."""
    return "/" + "/".join(p for p in path.split("/") if p)


def _dedupe_policy(policy, given_secrets):
    """A policy the server reads as the document means it: one file rule a
    path, no mount at or under another's target, no name both in `env` and
    `secrets`, no option twice or `bind` with `rbind`."""
    if not isinstance(policy, dict):
        return
    files = policy.get("files")
    if isinstance(files, list):
        seen, kept = set(), []
        for f in files:
            if isinstance(f, dict) and isinstance(f.get("path"), str):
                p = _norm(f["path"])
                if p in seen:
                    continue
                seen.add(p)
            kept.append(f)
        policy["files"] = kept
    mounts = policy.get("mounts")
    if isinstance(mounts, list):
        kept, targets = [], []
        for m in mounts:
            if isinstance(m, str):
                parts = m.split("\t")
                target = parts[1] if len(parts) == 4 else None
                if len(parts) == 4 and parts[3] != "-":
                    words = list(dict.fromkeys(parts[3].split(",")))
                    if "bind" in words and "rbind" in words:
                        words.remove("rbind")
                    parts[3] = ",".join(words)
                    m = "\t".join(parts)
            elif isinstance(m, dict):
                target = m.get("target")
                opts = m.get("options")
                if isinstance(opts, list) and "bind" in opts and "rbind" in opts:
                    opts.remove("rbind")
            else:
                target = None
            if isinstance(target, str):
                t = _norm(target)
                if any(t == o or o.startswith(t.rstrip("/") + "/") or t == "/" for o in targets):
                    continue
                targets.append(t)
            kept.append(m)
        policy["mounts"] = kept
    tiers = policy.get("path")
    if isinstance(tiers, str) and tiers:
        policy["path"] = ":".join(dict.fromkeys(tiers.split(":")))
    env = policy.get("env") if isinstance(policy.get("env"), dict) else {}
    secrets = policy.get("secrets")
    if isinstance(secrets, list):
        policy["secrets"] = [s for s in secrets if s not in env]
    for name in given_secrets:
        env.pop(name, None)


@schemathesis.hook
def map_case(context, case):
    # These two keep a valid request valid and an invalid one invalid, so
    # they apply to every case.
    headers = case.headers
    if headers and isinstance(headers.get("Idempotency-Key"), str) and KEY.match(headers["Idempotency-Key"]):
        # A key is kept for a day: one generated twice would replay another
        # request's answer, or be refused (422) for another body.
        headers["Idempotency-Key"] = uuid.uuid4().hex
    path = case.operation.path
    if path.endswith("/wait"):
        # A wait is valid up to an hour (30 s without a body); a fifth of a
        # second is as good a wait here, and keeps the run short.
        if isinstance(case.body, NotSet):
            case.body = {}
            case.media_type = "application/json"
        if isinstance(case.body, dict):
            t = case.body.get("timeout_s", None)
            if t is None or (isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t <= 3600):
                case.body["timeout_s"] = min(t, 0.2) if t is not None else 0.2
    if not _positive(case):
        return case
    body = case.body
    if not isinstance(body, dict):
        return case
    given = body.get("secrets") if isinstance(body.get("secrets"), dict) else {}
    policy = body.get("policy")
    if isinstance(policy, dict):
        _dedupe_policy(policy, given)
        # A root's secrets come with it: a value for every name its policy lists.
        if path in ("/api/agents", "/api/mcp/session") and isinstance(policy.get("secrets"), list):
            values = dict(given)
            for name in policy["secrets"]:
                values.setdefault(name, "value")
            body["secrets"] = values
    if isinstance(body.get("env"), dict):
        for name in given:
            body["env"].pop(name, None)
    worker = body.get("worker")
    if isinstance(worker, dict):
        if isinstance(worker.get("policy"), dict):
            _dedupe_policy(worker["policy"], {})
        if worker.get("argv") is not None:
            # `config` and `provider` configure the default worker only.
            worker.pop("config", None)
            worker.pop("provider", None)
    if path == "/api/jobs" and case.method.upper() == "POST":
        # The instruction's `{column}`s must be columns of every row: rows
        # are made with the columns it names (the document cannot relate them).
        instruction = body.get("instruction")
        if isinstance(instruction, str):
            # A brace that opens or closes no `{column}` is written doubled
            # (the template's literal brace); made so here.
            parts = re.split(r"(\{[^{}]+\})", instruction)
            instruction = "".join(
                p if i % 2 else p.replace("{", "{{").replace("}", "}}") for i, p in enumerate(parts)
            )
            body["instruction"] = instruction
            columns = re.findall(r"(?<!\{)\{([^{}]*)\}(?!\})", instruction)
            row = {c: "x" for c in columns}
            if isinstance(body.get("id_column"), str):
                row[body["id_column"]] = "1"
            row.setdefault("text", "x")
            body["input"] = [row]
            body.pop("input_format", None)
        if isinstance(body.get("output_schema"), dict):
            # The document says a JSON Schema without inlining the
            # metaschema; an object made up as one rarely is one.
            body["output_schema"] = {"type": "object", "required": ["answer"]}
    return case


# What the server says (crates/runtime/src/intake.rs) when a request names
# a path or program this host does not have, or has but not for an agent:
# the document cannot know the host's files.
HOST_FILES = (
    "does not exist",
    "is not a directory",
    "a component of it is not a directory",
    "too many symbolic links",
    "the name is too long",
    "is not a regular file",
    "is not found in the agent's path",
    "is not executable by the agent",
    "outside the agent's mount table",
    "may not enter",
    "may not read",
    "hidden from every agent",
    "mounted noexec",
    "the supervisor may not look at it",
    "cannot be looked at",
)


@schemathesis.hook
def filter_failure(context, failure, case, response):
    # A 400 that names a missing program, directory or file: valid by the
    # document (which cannot know this host's files), refused by this host.
    if response is not None and response.status_code == 400:
        try:
            message = response.json()["error"]["message"].lower()
        except Exception:
            return True
        if any(h in message for h in HOST_FILES):
            return False
    return True
