"""An MCP client for brood's MCP tests (crates/cli/tests/mcp.rs), written
with the official MCP Python SDK (`mcp` on PyPI, installed by .ci/setup).

    client.py session CONFIG_JSON   connect, exercise the tools, print a JSON summary
    client.py hold CONFIG_JSON      connect, spawn a hanging tree, print it as a
                                    JSON line, then wait to be killed
    client.py inside CONFIG_JSON    (as a brood agent's program) spawn and wait for a child
    client.py confined CONFIG_JSON  every tool aimed at another tree, then at its own
    client.py tasks CONFIG_JSON     the tasks extension: spawn as a task, tasks/get, tasks/cancel,
                                    a reconnected client, and the older revision without tasks
    client.py traced CONFIG_JSON    spawn a child and wait for it, the harness's
                                    traceparent on every request

CONFIG: {"transport": "stdio"|"http"|"http_unix", "brood": EXE, "socket": SOCK, "root": DIR, "url": URL,
"token": TOKEN, "mode": "auto"|"legacy"|"2024-11-05", "agent": [argv prefix of
the test agent]}. Every tool result is reported as it came, so the Rust test
asserts on what the client saw.
"""

import asyncio
import json
import os
import sys
from typing import Any, ClassVar, Literal

from pydantic import Field, TypeAdapter

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
import mcp.client.session as client_session
import httpx2
import mcp_types as types
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim

TASKS = "io.modelcontextprotocol/tasks"


class TaskHandle(types.Result):
    """What a tools/call answers when the server made a task of it (SEP-2663)."""

    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str
    status: str
    created_at: str
    last_updated_at: str
    poll_interval_ms: int | None = None


class TaskIdParams(types.RequestParams):
    task_id: str


class GetTask(types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param: ClassVar[str | None] = "taskId"


class CancelTask(types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param: ClassVar[str | None] = "taskId"


class TaskResult(types.Request[TaskIdParams, Literal["tasks/result"]]):
    method: Literal["tasks/result"] = "tasks/result"
    name_param: ClassVar[str | None] = "taskId"


ANY = TypeAdapter(dict[str, Any])


async def task_result(session, task_id):
    """tasks/result: the task's tool result once it ended, or the error's message."""
    try:
        return {"result": await session.send_request(TaskResult(params=TaskIdParams(task_id=task_id)), ANY)}
    except Exception as e:
        return {"error": str(e)}


async def task_get(session, task_id):
    """tasks/get as the test reads it: the task, or the error's message."""
    try:
        r = await session.send_request(GetTask(params=TaskIdParams(task_id=task_id)), ANY)
        return {"task": r.get("task", r)}
    except Exception as e:  # the SDK raises MCPError for a JSON-RPC error
        return {"error": str(e)}


async def task_cancel(session, task_id):
    try:
        await session.send_request(CancelTask(params=TaskIdParams(task_id=task_id)), ANY)
        return {"ok": True}
    except Exception as e:
        return {"error": str(e)}


async def until_done(session, task_id, tries=400):
    """Polls tasks/get as the extension says, until the task is terminal."""
    r = {}
    for _ in range(tries):
        r = await task_get(session, task_id)
        if "error" in r or r["task"]["status"] in ("completed", "failed", "cancelled"):
            break
        await asyncio.sleep(r["task"].get("pollIntervalMs", 500) / 1000)
    return r


class Tasks(ClientExtension):
    """The tasks extension, client side: a task answered to tools/call is
    polled with tasks/get until it is terminal, and its result returned."""

    identifier = TASKS

    def claims(self):
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self.resolve)]

    async def resolve(self, handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
        done = await until_done(ctx.session, handle.task_id)
        if "error" in done:
            raise RuntimeError(done["error"])
        t = done["task"]
        if t["status"] != "completed":
            return types.CallToolResult(content=[types.TextContent(type="text", text=t["status"])], is_error=True)
        return types.CallToolResult.model_validate(t["result"])


def connect(cfg):
    mode = cfg.get("mode", "auto")
    if mode == "2024-11-05":
        # The SDK's handshake asks for its newest handshake version; an older
        # client (most harnesses today) asks for this one.
        client_session.LATEST_HANDSHAKE_VERSION = "2024-11-05"
        mode = "legacy"
    info = types.Implementation(name=cfg.get("client_name", "Test Client"), version="1.0")
    if cfg["transport"] == "stdio":
        server = StdioServerParameters(
            command=cfg["brood"],
            args=["--root", cfg["root"], "mcp"] + cfg.get("mcp_args", []),
            env={"BROOD_LOG": "info"},
        )
    elif cfg["transport"] == "http_unix":
        # `/mcp` on the control socket: the daemon knows the caller by its
        # credentials (inside an agent: that agent). A harness's trace
        # context, when given, goes with every request (crates/cli/tests/otel.rs).
        headers = {"traceparent": cfg["traceparent"]} if "traceparent" in cfg else {}
        http = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=cfg["socket"]),
                                  headers=headers, timeout=httpx2.Timeout(60.0))
        server = streamable_http_client("http://brood/mcp", http_client=http)
    else:
        http = create_mcp_http_client(headers={"Authorization": "Bearer " + cfg["token"]})
        server = streamable_http_client(cfg["url"], http_client=http)
    extensions = [Tasks()] if cfg.get("tasks") else None
    return Client(server, mode=mode, client_info=info, extensions=extensions)


def shown(r):
    """A tool result as the test reads it."""
    return {
        "is_error": bool(r.is_error),
        "structured": r.structured_content,
        "text": "".join(getattr(c, "text", "") for c in r.content),
    }


async def call(client, tool, args):
    return shown(await client.call_tool(tool, args))


def spawn_json(cfg, name, flags):
    return json.dumps({"name": name, "argv": cfg["agent"] + flags, "task": "task of " + name})


async def hanging_tree(client, cfg, prefix):
    """A child that starts a grandchild agent and two grandchild processes, all hanging."""
    args = {
        "task": "hang with a grandchild",
        "name": prefix + "-h",
        "argv": cfg["agent"] + ["--spawn", spawn_json(cfg, prefix + "-g", ["--hang"]),
                                "--grandchildren", "2", "--hang"],
    }
    if "http_root_tools" in cfg:
        # Over HTTP the operator has no session root: this child is a root,
        # given only these tools so its own children can ask for more.
        args["capabilities"] = {"tools": cfg["http_root_tools"]}
    child = await call(client, "spawn", args)
    # Until the grandchild agent runs (its parent made it).
    for _ in range(200):
        tree = await call(client, "show", {"agent": prefix + "-g"})
        if not tree["is_error"] and tree["structured"]["status"] == "running":
            break
        await asyncio.sleep(0.05)
    shows = {}
    for n in (prefix + "-h", prefix + "-g"):
        shows[n] = await call(client, "show", {"agent": n})
    return child, shows


async def until(client, tool, args, done, tries=300):
    """Calls `tool` until `done(result)` holds (or tries run out), returning the last result."""
    for _ in range(tries):
        r = await call(client, tool, args)
        if done(r):
            break
        await asyncio.sleep(0.1)
    return r


async def session(cfg):
    out = {}
    p = cfg.get("prefix", "t")
    async with connect(cfg) as client:
        out["protocol_version"] = client.protocol_version
        tools = await client.list_tools()
        out["tools"] = sorted(t.name for t in tools.tools)
        out["schemas"] = {t.name: t.input_schema for t in tools.tools}

        quick = await call(client, "spawn", {"task": "say hello", "argv": cfg["agent"] + ["--result", "hello from child"]})
        out["spawn"] = quick
        name = quick["structured"]["name"]
        out["wait"] = await call(client, "wait", {"agents": [name], "timeout_s": 20})
        out["show"] = await call(client, "show", {"agent": name})

        if "agent_config" in cfg:
            # `brood agent`, the default program, with the operator's configuration.
            out["agent_spawn"] = await call(client, "spawn", {"task": "explore a little", "type": "explore",
                                                              "name": p + "-a"})
            out["agent_wait"] = await call(client, "wait", {"agents": [p + "-a"], "timeout_s": 20})

        # send, close, resume.
        talk = await call(client, "spawn", {"task": "take one input", "name": p + "-i",
                                            "argv": cfg["agent"] + ["--inputs", "1", "--result", "got"]})
        out["talk_spawn"] = talk
        out["send"] = await call(client, "send", {"agent": p + "-i", "text": "a message over MCP"})
        out["talk_wait"] = await call(client, "wait", {"agents": [p + "-i"], "timeout_s": 20})
        out["close"] = await call(client, "close", {"agent": name})
        out["resume"] = await call(client, "resume", {"agent": name})
        out["resumed_wait"] = await call(client, "wait", {"agents": [name], "timeout_s": 20})

        # What a child hands back: its refs, through `show`.
        ref = json.dumps({"path": "/src/lib.rs", "summary": "read this first", "id": "lib"})
        await call(client, "spawn", {"task": "hand back a ref", "name": p + "-r",
                                     "argv": cfg["agent"] + ["--ref", ref, "--result", "see refs"]})
        await call(client, "wait", {"agents": [p + "-r"], "timeout_s": 20})
        out["refs_show"] = await call(client, "show", {"agent": p + "-r"})

        # A job whose workers are the session's children.
        job = {
            "id": p + "-job", "instruction": "Echo {text}", "input": "id,text\na,first\nb,second\n",
            "id_column": "id", "worker": {"argv": cfg["agent"] + ["--job-worker"]}, "start": True,
        }
        if "http_root_tools" in cfg:
            # No session over HTTP: the job needs an owner, a live agent.
            await call(client, "spawn", {"task": "own a job", "name": p + "-o", "argv": cfg["agent"] + ["--hang"]})
            job["owner"] = p + "-o"
        out["job_create"] = await call(client, "job_create", job)
        out["job_done"] = await until(client, "job_show", {"id": p + "-job"},
                                      lambda r: r["is_error"] or r["structured"]["job"]["status"] in ("completed", "failed", "cancelled"))
        out["job_items"] = await call(client, "job_show", {"id": p + "-job", "items": True})
        out["job_export"] = await call(client, "job_export", {"id": p + "-job"})
        out["job_replay"] = await call(client, "job_replay", {"id": p + "-job", "new_id": p + "-job2"})
        if "http_root_tools" in cfg:
            await call(client, "cancel", {"agent": p + "-o"})

        child, shows = await hanging_tree(client, cfg, p)
        out["hang_spawn"] = child
        out["hang_show"] = shows
        out["hang_wait"] = await call(client, "wait", {"agents": [p + "-h"], "timeout_s": 1})
        out["list"] = await call(client, "list", {})
        out["tree"] = await call(client, "tree", {})
        # A child of the hanging one asking for more than it holds.
        out["refused"] = await call(client, "spawn", {
            "task": "ask for more", "parent": p + "-h", "argv": cfg["agent"] + ["--result", "x"],
            "capabilities": {"tools": ["shell"]},
        })
        if cfg["transport"] == "stdio":
            # A child of the session itself asking for more than the session's policy.
            out["refused_direct"] = await call(client, "spawn", {
                "task": "ask the session for more", "argv": cfg["agent"] + ["--result", "x"],
                "capabilities": {"tools": ["create", "shell"], "network": "all"},
            })
        out["cancel"] = await call(client, "cancel", {"agent": p + "-h"})
        out["after_cancel"] = await call(client, "wait", {"agents": [p + "-h", p + "-g"], "timeout_s": 20})

        out["bad_args"] = await call(client, "send", {"agent": p + "-h"})
        out["unknown"] = await call(client, "show", {"agent": "no-such-agent"})
        out["events"] = await call(client, "events", {"type": "agent.stop", "limit": 50})
        out["jobs"] = await call(client, "job_show", {})
    print(json.dumps(out))


async def confined(cfg):
    """A session driven by a hostile model: every tool aimed at another tree
    (`victim`, its job `vjob`), then the same tools on its own subtree."""
    out = {}
    v = cfg["victim"]
    child = cfg["agent"] + ["--result", "x"]
    async with connect(cfg) as client:
        out["own_spawn"] = await call(client, "spawn", {"task": "mine", "name": "own-c", "argv": child})
        attacks = {
            "spawn_parent": ("spawn", {"task": "steal its rights", "name": "stolen-c", "parent": v, "argv": child}),
            "spawn_customer": ("spawn", {"task": "forge its input", "name": "forged-c", "customer": v, "argv": child}),
            "send": ("send", {"agent": v, "text": "forged input"}),
            "show": ("show", {"agent": v}),
            "tree": ("tree", {"root": v}),
            "list": ("list", {"parent": v}),
            "events": ("events", {"agent": v}),
            "wait": ("wait", {"agents": [v], "timeout_s": 1}),
            "cancel": ("cancel", {"agent": v}),
            "close": ("close", {"agent": v}),
            "resume": ("resume", {"agent": v}),
            "job_create": ("job_create", {"id": "stolen-job", "owner": v, "instruction": "x {a}",
                                          "input": [{"a": 1}], "worker": {"argv": child}, "start": True}),
            "job_show": ("job_show", {"id": cfg["victim_job"]}),
            "job_start": ("job_start", {"id": cfg["victim_job"]}),
            "job_cancel": ("job_cancel", {"id": cfg["victim_job"]}),
            "job_retry": ("job_retry", {"id": cfg["victim_job"]}),
            "job_export": ("job_export", {"id": cfg["victim_job"]}),
            "job_replay": ("job_replay", {"id": cfg["victim_job"], "new_id": "replayed-job"}),
        }
        out["attacks"] = {}
        for k, (tool, args) in attacks.items():
            out["attacks"][k] = await call(client, tool, args)
        # What it may still do: its own subtree, and only that.
        out["own_wait"] = await call(client, "wait", {"agents": ["own-c"], "timeout_s": 20})
        out["own_show"] = await call(client, "show", {"agent": "own-c"})
        out["own_tree"] = await call(client, "tree", {})
        out["own_list"] = await call(client, "list", {"all": True})
        out["own_events"] = await call(client, "events", {})
        out["own_jobs"] = await call(client, "job_show", {})
    # A session of the tasks extension: the victim as a task is not found,
    # and not cancelled.
    async with connect(dict(cfg, tasks=True)) as client:
        out["task_attacks"] = {
            "get": await task_get(client.session, v),
            "cancel": await task_cancel(client.session, v),
        }
    print(json.dumps(out))


async def tasks(cfg):
    """The tasks extension with the SDK's claim machinery (a client that
    declares it), then raw: a handle, tasks/get, tasks/cancel; a client that
    reconnects; and a client of the older revision, which gets no task."""
    out = {}
    p = cfg.get("prefix", "k")
    cfg = dict(cfg, tasks=True)
    async with connect(cfg) as client:
        out["protocol_version"] = client.protocol_version
        # Transparent: the SDK resolves the task into the tool's result.
        out["resolved"] = await call(client, "spawn", {"task": "say hello", "name": p + "-q",
                                                       "argv": cfg["agent"] + ["--result", "hello from a task"]})
        # Raw: the handle itself.
        handle = await client.session.call_tool("spawn", {"task": "hang", "name": p + "-h",
                                                          "argv": cfg["agent"] + ["--grandchildren", "1", "--hang"]},
                                                allow_claimed=True)
        out["handle"] = handle.model_dump(by_alias=True, mode="json")
        running = {}
        for _ in range(200):
            running = await task_get(client.session, p + "-h")
            if "error" in running or running["task"].get("statusMessage") == "running":
                break
            await asyncio.sleep(0.05)
        out["running"] = running
        out["running_show"] = await call(client, "show", {"agent": p + "-h"})
        out["cancel"] = await task_cancel(client.session, p + "-h")
        out["cancelled"] = await until_done(client.session, p + "-h")
        out["failing"] = await call(client, "spawn", {"task": "fail", "name": p + "-f",
                                                      "argv": cfg["agent"] + ["--error", "it broke"]})
        out["result_of"] = await task_result(client.session, p + "-q")
        out["result_of_cancelled"] = await task_result(client.session, p + "-h")
        out["result_unknown"] = await task_result(client.session, "no-such-task")
        out["unknown"] = await task_get(client.session, "no-such-task")
        out["unknown_cancel"] = await task_cancel(client.session, "no-such-task")
        out["bad_id"] = await task_get(client.session, "../etc")
    # A new connection finds the tasks of the first.
    async with connect(cfg) as client:
        out["reconnected"] = await task_get(client.session, p + "-q")
    # The older revision: no extension negotiated, spawn answers the child.
    async with connect(dict(cfg, mode="legacy")) as client:
        out["legacy_version"] = client.protocol_version
        out["legacy_spawn"] = await call(client, "spawn", {"task": "old style", "name": p + "-l",
                                                           "argv": cfg["agent"] + ["--result", "old"]})
        out["legacy_wait"] = await call(client, "wait", {"agents": [p + "-l"], "timeout_s": 20})
    print(json.dumps(out))


async def hold(cfg):
    async with connect(cfg) as client:
        child, shows = await hanging_tree(client, cfg, cfg["prefix"])
        owner = child["structured"]["parent"]
        print(json.dumps({"pid": os.getpid(), "owner": owner, "child": child, "shows": shows}), flush=True)
        await asyncio.sleep(3600)


async def inside(cfg):
    """Run as a brood agent's program: the session's children are that agent's."""
    out = {}
    async with connect(cfg) as client:
        out["spawn"] = await call(client, "spawn", {"task": "from inside", "name": "in-c",
                                                    "argv": cfg["agent"] + ["--result", "made inside"]})
        out["wait"] = await call(client, "wait", {"agents": ["in-c"], "timeout_s": 20})
        out["list"] = await call(client, "list", {"all": True})
    print(json.dumps(out))


async def traced(cfg):
    """A harness in a trace of its own asks for a child (crates/cli/tests/otel.rs)."""
    out = {}
    async with connect(cfg) as client:
        out["spawn"] = await call(client, "spawn", {"task": "traced", "name": cfg["prefix"],
                                                    "argv": cfg["agent"] + ["--result", "traced"]})
        out["wait"] = await call(client, "wait", {"agents": [cfg["prefix"]], "timeout_s": 20})
    print(json.dumps(out))


if __name__ == "__main__":
    what, cfg = sys.argv[1], json.loads(sys.argv[2])
    asyncio.run({"session": session, "hold": hold, "inside": inside, "confined": confined,
                 "tasks": tasks, "traced": traced}[what](cfg))
