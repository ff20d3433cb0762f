// brood's web UI (docs/ui.md): the live tree, an agent's page, jobs.
//
// Everything an agent wrote (names, labels, transcripts, results) is hostile
// input: this script builds DOM nodes and sets their textContent, never
// markup. It reads the JSON API of the daemon that served it (its cookie
// authenticates), sends X-Brood-Csrf on every mutation, and follows
// /api/events to stay live without reloading.
"use strict";

const main = document.getElementById("main");
const live = document.getElementById("live");
const errorBar = document.getElementById("error");

// ---- small helpers -------------------------------------------------------

// An element with attributes and children; strings become text nodes.
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return e;
}

function showError(msg) {
  errorBar.textContent = msg;
  errorBar.hidden = !msg;
}

async function getJson(path) {
  const r = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  const body = await r.json().catch(() => null);
  if (!r.ok) {
    const m = body && body.error ? body.error.code + ": " + body.error.message : r.status + " " + r.statusText;
    throw new Error(path + ": " + m);
  }
  return body;
}

// A mutation: the cookie authenticates it, the header proves it came from
// this page (docs/decisions/ui-and-mcp.md "Mutations authenticated by the
// cookie need `X-Brood-Csrf: 1`").
async function post(path, body) {
  const r = await fetch(path, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-Brood-Csrf": "1" },
    body: JSON.stringify(body || {}),
  });
  const answer = await r.json().catch(() => null);
  if (!r.ok) {
    const m = answer && answer.error ? answer.error.code + ": " + answer.error.message : String(r.status);
    throw new Error(m);
  }
  return answer;
}

const enc = encodeURIComponent;

function agentLink(name) {
  return el("a", { href: "#/agent/" + enc(name), class: "name", "data-agent": name }, name);
}

function statusBadge(status, reason, word) {
  const shown = word || status;
  const text = reason ? shown + " (" + reason + ")" : shown;
  return el("span", { class: "badge st-" + status, "data-status": status }, text);
}

// An agent's status as the CLI writes it (`render::status`): its word,
// `stopping` while a stop is under way, then its reason in brackets.
function agentBadge(a) {
  const stopping = (a.state || "").startsWith("stopping/");
  return statusBadge(a.status, a.reason, stopping ? "stopping" : a.status);
}

function money(x) {
  return "$" + (x || 0).toFixed(x >= 1 ? 2 : 4);
}

function tokens(u) {
  const n = (u.tokens_in || 0) + (u.tokens_out || 0);
  return n >= 10000 ? (n / 1000).toFixed(1) + "k tok" : n + " tok";
}

function spendText(u) {
  if (!u.cost_usd && !u.tokens_in && !u.tokens_out) return "–";
  return money(u.cost_usd) + " · " + tokens(u);
}

function duration(ms) {
  if (ms === null || ms === undefined || ms < 0) return "";
  if (ms < 1000) return (ms / 1000).toFixed(1) + "s";
  const s = Math.floor(ms / 1000);
  if (s < 60) return s + "s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + "m " + (s % 60) + "s";
  return Math.floor(m / 60) + "h " + (m % 60) + "m";
}

function when(ms) {
  return ms ? new Date(ms).toLocaleString() : "";
}

function pretty(v) {
  return JSON.stringify(v, null, 2);
}

// Calls f at most once per `ms`, the last call always honoured.
function throttle(f, ms) {
  let timer = null;
  let again = false;
  return function () {
    if (timer) {
      again = true;
      return;
    }
    f();
    timer = setTimeout(function tick() {
      timer = null;
      if (again) {
        again = false;
        f();
        timer = setTimeout(tick, ms);
      }
    }, ms);
  };
}

// ---- the event stream ------------------------------------------------------

// The view on screen: its streams and timers, closed when another view
// replaces it. A view still loading when the reader moved on finds itself
// no longer current and stops (draws nothing, follows nothing).
let scope = { cleanups: [] };

function follow(my, query, onEvent) {
  if (my !== scope) return;
  const src = new EventSource("/api/events?" + query);
  src.onopen = () => {
    live.textContent = "live";
    live.className = "live on";
  };
  src.onerror = () => {
    live.textContent = "reconnecting";
    live.className = "live off";
  };
  src.onmessage = (m) => {
    let e = null;
    try {
      e = JSON.parse(m.data);
    } catch (_) {
      return;
    }
    onEvent(e);
  };
  // A subscriber too far behind is told to resync: the browser reconnects
  // with Last-Event-ID by itself once the stream ends.
  src.addEventListener("resync", () => onEvent(null));
  my.cleanups.push(() => src.close());
  return src;
}

function every(my, ms, f) {
  if (my !== scope) return;
  const t = setInterval(f, ms);
  my.cleanups.push(() => clearInterval(t));
}

// ---- the tree --------------------------------------------------------------

const collapsed = new Set();

async function treeView() {
  const my = scope;
  main.replaceChildren(el("p", { class: "muted" }, "loading the tree…"));
  let data = null;
  let skew = 0; // the server's clock minus this browser's
  const summary = el("div", { class: "summary", id: "summary" });
  const body = el("div", { class: "tree", id: "tree" });

  function runningFor(a) {
    if (!a.started_ms) return "";
    const end = a.ended_ms || Date.now() + skew;
    return duration(end - a.started_ms);
  }

  function render() {
    if (!data) return;
    const byParent = new Map();
    const counts = {};
    for (const a of data.agents) {
      counts[a.status] = (counts[a.status] || 0) + 1;
      const k = a.parent || "";
      if (!byParent.has(k)) byParent.set(k, []);
      byParent.get(k).push(a);
    }
    summary.replaceChildren(
      el("span", { class: "stat" }, el("b", {}, String(data.agents.length)), "agents"),
      ...["running", "queued", "blocked", "stopping", "completed", "failed", "cancelled"]
        .filter((s) => counts[s])
        .map((s) => el("span", { class: "stat", "data-count": s }, el("b", {}, String(counts[s])), statusBadge(s))),
    );
    const rows = [
      el("div", { class: "row head" }, el("span", {}, "agent"), el("span", {}, "type"), el("span", {}, "status"),
        el("span", {}, "running"), el("span", {}, "own spend"), el("span", {}, "subtree spend")),
    ];
    // Depth-first from the roots the listing names (an agent caller's root
    // has a parent outside its view).
    const names = new Set(data.agents.map((a) => a.name));
    const roots = data.agents.filter((a) => !a.parent || !names.has(a.parent));
    const stack = roots.slice().reverse().map((a) => [a, 0]);
    while (stack.length) {
      const [a, depth] = stack.pop();
      const kids = byParent.get(a.name) || [];
      const closed = collapsed.has(a.name);
      const toggle = el("button", {
        class: "toggle" + (kids.length ? "" : " leaf"),
        title: closed ? "expand" : "collapse",
        "aria-label": (closed ? "expand " : "collapse ") + a.name,
        onclick: () => {
          if (collapsed.has(a.name)) collapsed.delete(a.name);
          else collapsed.add(a.name);
          render();
        },
      }, closed ? "▸" : "▾");
      const who = el("span", { class: "who" }, toggle, agentLink(a.name),
        a.children ? el("span", { class: "badge kids", title: a.children + " children" }, "⤷ " + a.children) : null,
        a.label ? el("span", { class: "label" }, a.label) : null);
      who.style.paddingLeft = depth * 18 + "px";
      const st = el("span", {}, agentBadge(a));
      if (a.detail && (a.status === "blocked" || a.status === "failed" || a.status === "queued")) {
        st.title = a.detail;
      }
      rows.push(el("div", { class: "row " + a.status, "data-row": a.name },
        who,
        el("span", {}, el("span", { class: "badge kind" }, a.kind)),
        st,
        el("span", { class: "num", "data-started": a.started_ms || "", "data-ended": a.ended_ms || "" }, runningFor(a)),
        el("span", { class: "num" }, spendText(a.own)),
        el("span", { class: "num" }, spendText(a.subtree))));
      if (!closed) {
        for (let i = kids.length - 1; i >= 0; i--) stack.push([kids[i], depth + 1]);
      }
    }
    if (rows.length === 1) rows.push(el("p", { class: "note", id: "empty" }, "No agents yet: `brood spawn …` or POST /api/agents starts one."));
    body.replaceChildren(...rows);
  }

  // "Only trees at work": kept in this browser, off by default.
  const onlyLive = el("input", { type: "checkbox", id: "only-live", onchange: () => {
    localStorage.setItem("brood.onlyLive", onlyLive.checked ? "1" : "");
    load();
  } });
  onlyLive.checked = localStorage.getItem("brood.onlyLive") === "1";

  async function load() {
    try {
      data = await getJson("/api/ui/tree" + (onlyLive.checked ? "?live=true" : ""));
      skew = data.now_ms - Date.now();
      render();
      showError("");
    } catch (e) {
      showError(String(e.message || e));
    }
  }

  await load();
  if (my !== scope) return;
  main.replaceChildren(el("h1", {}, "Agents",
    el("label", { class: "filter" }, onlyLive, "only trees at work")), summary, body);
  const reload = throttle(load, 400);
  // Any agent's change reloads the compact listing (one request, whatever
  // the tree's size); the stream starts where the listing was read.
  follow(my, "after=" + enc(data ? data.sequence : 0), () => reload());
  // Running times tick without asking the server.
  every(my, 1000, () => {
    for (const n of body.querySelectorAll("[data-started]")) {
      const s = Number(n.dataset.started);
      if (!s || n.dataset.ended) continue;
      n.textContent = duration(Date.now() + skew - s);
    }
  });
}

// ---- the timeline ------------------------------------------------------------

// Each agent's life on one time axis, from the same compact listing as the
// tree (one request, whatever the tree's size): queued from its creation to
// its current run's start, running from there to its end (or now), waiting
// from when it began to wait while it is blocked, and its end with the
// reason. Past waits and earlier runs are in its events and its page.
async function timelineView() {
  const my = scope;
  main.replaceChildren(el("p", { class: "muted" }, "loading the timeline…"));
  let data = null;
  const axis = el("div", { class: "tl-axis", id: "tl-axis" });
  const body = el("div", { class: "timeline", id: "timeline" });

  function segment(cls, from, to, t0, span, title) {
    const seg = el("span", { class: "seg " + cls, title });
    seg.style.left = ((from - t0) / span) * 100 + "%";
    seg.style.width = Math.max(((to - from) / span) * 100, 0.15) + "%";
    return seg;
  }

  function render() {
    if (!data) return;
    const now = data.now_ms;
    const t0 = Math.min(...data.agents.map((a) => a.created_ms), now);
    const t1 = Math.max(...data.agents.map((a) => a.ended_ms || now), t0 + 1);
    const span = t1 - t0;
    axis.replaceChildren(el("span", {}, when(t0)), el("span", {}, "+" + duration(span)), el("span", {}, when(t1)));
    const byParent = new Map();
    for (const a of data.agents) {
      const k = a.parent || "";
      if (!byParent.has(k)) byParent.set(k, []);
      byParent.get(k).push(a);
    }
    const names = new Set(data.agents.map((a) => a.name));
    const stack = data.agents.filter((a) => !a.parent || !names.has(a.parent)).reverse().map((a) => [a, 0]);
    const rows = [];
    while (stack.length) {
      const [a, depth] = stack.pop();
      const bar = el("div", { class: "tl-bar" });
      const start = a.started_ms || (a.status === "queued" ? null : a.ended_ms);
      const end = a.ended_ms || now;
      bar.append(segment("queued", a.created_ms, start || end, t0, span, "queued " + duration((start || end) - a.created_ms)));
      if (a.started_ms) {
        const waitFrom = a.status === "blocked" ? Math.max(a.updated_ms, a.started_ms) : end;
        bar.append(segment("running", a.started_ms, waitFrom, t0, span, "running " + duration(waitFrom - a.started_ms)));
        if (a.status === "blocked") {
          bar.append(segment("waiting", waitFrom, now, t0, span, "waiting " + duration(now - waitFrom) + (a.detail ? ": " + a.detail : "")));
        }
      }
      if (a.ended_ms) {
        bar.append(segment("end " + a.status, a.ended_ms, a.ended_ms, t0, span,
          a.status + (a.reason ? " (" + a.reason + ")" : "") + (a.detail ? ": " + a.detail : "")));
      }
      const who = el("span", { class: "who" }, agentLink(a.name));
      who.style.paddingLeft = depth * 14 + "px";
      rows.push(el("div", { class: "tl-row", "data-tl": a.name },
        who,
        el("span", {}, agentBadge(a)),
        bar));
      const kids = byParent.get(a.name) || [];
      for (let i = kids.length - 1; i >= 0; i--) stack.push([kids[i], depth + 1]);
    }
    if (!rows.length) rows.push(el("p", { class: "note", id: "empty" }, "No agents yet."));
    body.replaceChildren(...rows);
  }

  async function load() {
    try {
      data = await getJson("/api/ui/tree");
      render();
      showError("");
    } catch (e) {
      showError(String(e.message || e));
    }
  }

  await load();
  if (my !== scope) return;
  main.replaceChildren(el("h1", {}, "Timeline"),
    el("div", { class: "legend" }, ...["queued", "running", "waiting", "completed", "failed", "cancelled"].map((c) =>
      el("span", {}, el("span", { class: "seg " + (["completed", "failed", "cancelled"].includes(c) ? "end " : "") + c }), c))),
    axis, body);
  const reload = throttle(load, 1000);
  follow(my, "after=" + enc(data ? data.sequence : 0), () => reload());
}

// ---- an agent's page ---------------------------------------------------------

function facts(pairs) {
  const dl = el("dl", { class: "facts" });
  for (const [k, v] of pairs) {
    if (v === null || v === undefined || v === "") continue;
    dl.append(el("dt", {}, k), el("dd", {}, v));
  }
  return dl;
}

// The policy's limits, and what the launch said it could not enforce.
function limits(policy, meta) {
  const pairs = [];
  for (const k of ["cost_limit", "timeout_s", "depth_limit", "create_limit", "window", "network"]) {
    if (policy[k] !== undefined && policy[k] !== null) pairs.push([k, JSON.stringify(policy[k])]);
  }
  const res = policy.resources || {};
  for (const [k, v] of Object.entries(res)) {
    if (v === null) continue;
    pairs.push([k, k === "memory_max" && v >= 1048576 ? (v / 1048576).toFixed(0) + " MiB" : JSON.stringify(v)]);
  }
  // The model gateway's rate limits (issue 31), per minute.
  const rate = policy.model_rate || {};
  for (const [k, v] of Object.entries(rate)) {
    if (v !== null) pairs.push(["model_rate." + k, JSON.stringify(v)]);
  }
  if (Array.isArray(policy.tools)) pairs.push(["tools", policy.tools.join(", ") || "none"]);
  const sb = (meta && meta.sandbox) || {};
  const layers = ["files", "network", "scoped", "capabilities_dropped", "no_new_privs"].filter((k) => sb[k] === true);
  if (layers.length) pairs.push(["enforced", layers.join(", ")]);
  if (sb.landlock_abi !== undefined) pairs.push(["landlock ABI", String(sb.landlock_abi)]);
  if (Array.isArray(sb.weaker) && sb.weaker.length) pairs.push(["weaker", sb.weaker.join(", ")]);
  if (sb.limits_not_enforced !== undefined) pairs.push(["limits not enforced", JSON.stringify(sb.limits_not_enforced)]);
  const c = (meta && meta.containment) || {};
  if (c.kill) pairs.push(["kill", c.kill]);
  if (c.supervisor_death) pairs.push(["supervisor death", c.supervisor_death]);
  const out = pairs.length ? facts(pairs) : el("p", { class: "muted" }, "none recorded");
  out.id = "limits";
  return out;
}

function card(title, ...kids) {
  return el("section", { class: "card" }, el("h2", {}, title), ...kids);
}

async function agentView(name) {
  const my = scope;
  main.replaceChildren(el("p", { class: "muted" }, "loading " + name + "…"));
  const head = el("div", { id: "agent-head" });
  const actions = el("div", { class: "actions", id: "actions" });
  const cards = el("div", { class: "cards" });
  const runsCard = el("section", { class: "card", id: "runs" });
  const events = el("tbody", { id: "events" });
  // Each call through the model gateway, as brood counted it (issue 31):
  // the spend per call, from the agent's `agent.model.call` events.
  const calls = el("tbody", { id: "model-calls" });
  const noCalls = el("p", { class: "muted", id: "no-model-calls" }, "no model calls");
  const transcript = el("div", { class: "transcript scroll", id: "transcript" });
  // What it wrote to stderr (every run), and an exec agent's stdout (its
  // result): an exec program sends no messages, so this is its transcript.
  const stdout = el("pre", { id: "stdout" });
  const stderr = el("pre", { class: "scroll", id: "stderr" });
  let lastMessage = 0;
  let logNext = 0;
  let detail = null;
  const text = el("textarea", { id: "input-text", placeholder: "a message for " + name, "aria-label": "message" });
  const send = el("button", { id: "send", disabled: true, onclick: async () => {
    try {
      await post("/api/agents/" + enc(name) + "/input", { text: text.value });
      text.value = "";
      showError("");
    } catch (e) { showError("send: " + e.message); }
  } }, "Send input");
  const resume = el("button", { id: "resume", disabled: true, onclick: async () => {
    try {
      await post("/api/agents/" + enc(name) + "/resume", text.value ? { text: text.value } : {});
      text.value = "";
      load();
    } catch (e) { showError("resume: " + e.message); }
  } }, "Resume");
  const cancel = el("button", { id: "cancel", class: "danger", disabled: true, onclick: async () => {
    if (!window.confirm("Cancel " + name + " and its whole subtree?")) return;
    try {
      await post("/api/agents/" + enc(name) + "/cancel", {});
      load();
    } catch (e) { showError("cancel: " + e.message); }
  } }, "Cancel…");
  actions.append(text, send, resume, cancel);

  async function loadTranscript() {
    try {
      for (;;) {
        const t = await getJson("/api/ui/agents/" + enc(name) + "/transcript?after=" + lastMessage);
        for (const m of t.messages) {
          lastMessage = m.seq;
          transcript.append(el("div", { class: "msg " + m.role },
            el("div", { class: "role" }, m.role + " · " + when(m.ts_ms) + " · " + m.run),
            el("div", { class: "content" }, m.content)));
        }
        if (t.messages.length < 1000) break;
      }
    } catch (e) {
      showError(String(e.message || e));
    }
  }

  async function loadLog() {
    try {
      for (;;) {
        const l = await getJson("/api/agents/" + enc(name) + "/log?after=" + logNext);
        for (const e of l.entries) stderr.append(e.text + "\n");
        const more = l.next > logNext && l.entries.length > 0;
        logNext = l.next;
        if (!more) break;
      }
    } catch (e) {
      showError(String(e.message || e));
    }
  }

  async function load() {
    try {
      const [d, o, k] = await Promise.all([
        getJson("/api/agents/" + enc(name)),
        getJson("/api/ui/agents/" + enc(name)),
        getJson("/api/agents/" + enc(name) + "/children"),
      ]);
      detail = d;
      render(d, o, k.agents);
      showError("");
    } catch (e) {
      showError(String(e.message || e));
    }
  }

  function render(d, o, kids) {
    const kind = o.launch && Array.isArray(o.launch.argv) ? o.launch.argv.join(" ") : "";
    head.replaceChildren(
      el("h1", {}, el("span", { id: "agent-name" }, d.name), agentBadge(d),
        kids.length ? el("span", { class: "badge kids" }, "⤷ " + kids.length) : null),
      el("p", { class: "note" },
        d.parent ? el("a", { href: "#/agent/" + enc(d.parent), id: "parent-link" }, "← parent " + d.parent) : "a root",
        d.detail ? " · " + d.detail : ""),
    );
    const alive = ["running", "queued", "blocked", "stopping"].includes(d.status);
    const finished = ["completed", "failed", "cancelled"].includes(d.status);
    // The bar is built once (a draft in the text box survives live
    // updates); only what is allowed changes.
    send.disabled = !alive;
    cancel.disabled = !alive;
    resume.disabled = !finished;
    const runs = el("table", {}, el("thead", {}, el("tr", {}, ...["run", "#", "pid", "outcome", "exit", "started", "took", "spend"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...d.runs.map((r) => el("tr", {},
        el("td", { class: "mono", title: r.id }, r.id.slice(0, 8) + "…"), el("td", {}, String(r.seq)), el("td", {}, r.pid === null ? "" : String(r.pid)),
        el("td", {}, r.outcome || "running"), el("td", {}, r.exit_code === null ? "" : String(r.exit_code)),
        el("td", {}, when(r.started_ms)), el("td", {}, r.started_ms && r.ended_ms ? duration(r.ended_ms - r.started_ms) : ""),
        el("td", {}, spendText(r))))));
    const children = kids.length
      ? el("ul", { id: "children" }, ...kids.map((c) => el("li", {}, agentLink(c.name), " ", agentBadge(c))))
      : el("p", { class: "muted" }, "no children");
    const ch = o.channel;
    const channel = ch
      ? [facts([["status", ch.status]]),
        el("h3", {}, "handoff.md"), el("pre", { id: "handoff" }, ch.handoff),
        el("h3", {}, "result.md"), el("pre", { id: "result" }, ch.result === null ? "(none yet)" : ch.result),
        el("h3", {}, "refs.jsonl"), el("pre", {}, ch.refs === null || ch.refs === "" ? "(none)" : ch.refs),
        el("h3", {}, "artifacts"),
        ch.artifacts.length
          ? el("table", {}, el("tbody", {}, ...ch.artifacts.map((a) => el("tr", {},
            el("td", {}, el("a", { href: "/api/ui/agents/" + enc(d.name) + "/artifacts/" + enc(a.sha256), download: "", "data-artifact": a.name }, a.name)), el("td", {}, a.size + " B"), el("td", { class: "mono" }, a.sha256.slice(0, 16) + "…")))))
          : el("p", { class: "muted" }, "none")]
      : [el("p", { class: "muted" }, "a root: no parent's channel"), el("h3", {}, "result"),
        el("pre", { id: "result" }, d.result === null ? "(none yet)" : d.result)];
    cards.replaceChildren(
      card("Agent", facts([
        ["state", d.state], ["session", d.session], ["protocol", d.protocol], ["life", d.life], ["iso", d.iso],
        ["on restart", d.on_restart],
        ["run", d.run], ["pid", d.pid === null ? "" : String(d.pid)], ["cgroup", d.cgroup || ""],
        ["program", kind], ["created", when(d.created_ms)], ["started", when(d.started_ms)], ["ended", when(d.ended_ms)],
        ["exit code", d.exit_code === null ? "" : String(d.exit_code)],
        ["own spend", spendText(d.spend.own)], ["subtree spend", spendText(d.spend.subtree)],
        ["cost limit", d.cost_limit === null ? "none" : money(d.cost_limit)],
      ])),
      card("Children", children),
      card("Channel handed back", ...channel),
      card("Limits", limits(d.policy, o.meta)),
      card("Policy (effective, as admitted)", el("pre", { id: "policy" }, pretty(d.policy))),
      card("Enforced (meta.json)", el("pre", { id: "meta" }, pretty(o.meta)), el("h3", {}, "launch"), el("pre", {}, pretty(o.launch))),
    );
    runsCard.replaceChildren(el("h2", {}, "Runs"), runs);
    stdout.textContent = d.protocol === "exec" ? (d.result === null ? "(none yet)" : d.result) : "";
  }

  await load();
  if (my !== scope) return;
  main.replaceChildren(head, actions, cards, runsCard,
    el("section", { class: "card" }, el("h2", {}, "Transcript"), transcript,
      detail && detail.protocol === "exec" ? el("h3", {}, "stdout (an exec program's output: its result)") : null,
      detail && detail.protocol === "exec" ? stdout : null,
      el("h3", {}, "stderr (its log)"), stderr),
    el("section", { class: "card" }, el("h2", {}, "Model calls"), noCalls,
      el("div", { class: "scroll" }, el("table", {}, el("thead", {}, el("tr", {},
        ...["#", "time", "model", "endpoint", "tokens in/out", "cost", "latency", "outcome"].map((h) => el("th", {}, h)))), calls))),
    el("section", { class: "card" }, el("h2", {}, "Events"),
      el("div", { class: "scroll" }, el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "#"), el("th", {}, "time"), el("th", {}, "type"), el("th", {}, "payload"))), events))));
  await loadTranscript();
  await loadLog();
  const reload = throttle(load, 400);
  follow(my, "agent=" + enc(name), (e) => {
    if (e) {
      events.prepend(el("tr", {}, el("td", {}, String(e.sequence)), el("td", {}, when(e.timestamp)),
        el("td", {}, e.type), el("td", {}, el("pre", {}, JSON.stringify(e.payload)))));
      if (e.type === "agent.model.call" && e.payload) {
        const c = e.payload;
        noCalls.remove();
        calls.prepend(el("tr", { "data-call": String(e.sequence) }, el("td", {}, String(e.sequence)), el("td", {}, when(e.timestamp)),
          el("td", {}, String(c.model)), el("td", { class: "mono" }, String(c.endpoint)),
          el("td", { class: "num" }, c.tokens_in + " / " + c.tokens_out + (c.estimated ? " (estimated)" : "")),
          el("td", { class: "num" }, money(c.cost_usd)), el("td", { class: "num" }, c.latency_ms + " ms"),
          el("td", {}, c.outcome + (c.reason ? ": " + c.reason : ""))));
      }
    }
    reload();
  });
  // Messages are not events: the transcript is asked for while the agent lives.
  every(my, 1000, () => {
    if (detail && !["completed", "failed", "cancelled", "closed"].includes(detail.status)) {
      loadTranscript();
      loadLog();
    }
  });
}

// ---- jobs --------------------------------------------------------------------

const ITEM_STATES = ["completed", "reported", "failed", "running", "pending"];

function progressBar(j) {
  const bar = el("div", { class: "bar", title: ITEM_STATES.map((s) => s + " " + (j.counts[s] || 0)).join(", ") });
  for (const s of ITEM_STATES) {
    const n = j.counts[s] || 0;
    if (!n || !j.total) continue;
    const part = el("span", { class: s });
    part.style.width = (100 * n / j.total) + "%";
    bar.append(part);
  }
  return bar;
}

function countsText(j) {
  return ITEM_STATES.filter((s) => j.counts[s]).map((s) => j.counts[s] + " " + s).join(" · ");
}

async function jobsView() {
  const my = scope;
  main.replaceChildren(el("p", { class: "muted" }, "loading jobs…"));
  const body = el("tbody", { id: "jobs" });
  async function load() {
    try {
      const l = await getJson("/api/jobs");
      body.replaceChildren(...l.jobs.map((j) => el("tr", {},
        el("td", {}, el("a", { href: "#/job/" + enc(j.id) }, j.id)),
        el("td", {}, agentLink(j.owner)),
        el("td", {}, statusBadge(j.status)),
        el("td", {}, String(j.total)),
        el("td", {}, progressBar(j), el("span", { class: "muted" }, countsText(j))),
        el("td", {}, when(j.created_ms)))));
      if (!l.jobs.length) body.append(el("tr", {}, el("td", { colspan: 6, class: "muted" }, "No jobs yet (`brood job run`, POST /api/jobs).")));
      showError("");
    } catch (e) {
      showError(String(e.message || e));
    }
  }
  const from = await lastSequence();
  await load();
  if (my !== scope) return;
  main.replaceChildren(el("h1", {}, "Jobs"), el("div", { class: "card" }, el("table", {},
    el("thead", {}, el("tr", {}, ...["job", "owner", "status", "items", "progress", "created"].map((h) => el("th", {}, h)))), body)));
  const reload = throttle(load, 500);
  follow(my, "type=job.*&after=" + enc(from), () => reload());
}

// Where the event log is now: a page reads its data, then follows from here.
async function lastSequence() {
  try {
    return (await getJson("/api/ui/sequence")).sequence;
  } catch (_) {
    return 0;
  }
}

// An item's attempts, as a row under it.
async function attemptsRow(job, item) {
  const l = await getJson("/api/ui/jobs/" + enc(job) + "/items/" + enc(item) + "/attempts");
  return el("tr", { class: "attempts", "data-attempts-of": item }, el("td", {}), el("td", { colspan: 5 },
    el("table", {}, el("tbody", {}, ...l.attempts.map((a) => el("tr", {},
      el("td", {}, "attempt " + a.number),
      el("td", {}, statusBadge(a.outcome)),
      el("td", {}, a.worker ? agentLink(a.worker) : ""),
      el("td", {}, when(a.started_ms)),
      el("td", {}, a.ended_ms ? duration(a.ended_ms - a.started_ms) : ""),
      el("td", {}, a.error || "")))))));
}

async function jobView(id) {
  const my = scope;
  main.replaceChildren(el("p", { class: "muted" }, "loading job " + id + "…"));
  const open = new Set();
  const head = el("div", {});
  const items = el("tbody", { id: "items" });
  async function load() {
    try {
      const [j, l] = await Promise.all([
        getJson("/api/jobs/" + enc(id)),
        getJson("/api/jobs/" + enc(id) + "/items"),
      ]);
      head.replaceChildren(
        el("h1", {}, "Job ", el("span", { id: "job-id" }, j.id), statusBadge(j.status)),
        el("p", { class: "note" }, "owner ", agentLink(j.owner), j.source ? " · replays " : "",
          j.source ? el("a", { href: "#/job/" + enc(j.source) }, j.source) : "",
          " · created " + when(j.created_ms), j.ended_ms ? " · ended " + when(j.ended_ms) : ""),
        progressBar(j),
        el("div", { class: "summary", id: "job-counts" }, el("span", { class: "stat" }, el("b", {}, String(j.total)), "items"),
          ...ITEM_STATES.map((s) => el("span", { class: "stat", "data-count": s }, el("b", {}, String(j.counts[s] || 0)), statusBadge(s)))),
      );
      const rows = [];
      for (const it of l.items) {
        const toggle = el("button", {
          class: "toggle-attempts",
          title: "every attempt",
          disabled: !it.attempts,
          onclick: () => {
            if (open.has(it.id)) open.delete(it.id);
            else open.add(it.id);
            load();
          },
        }, String(it.attempts));
        rows.push(el("tr", { "data-item": it.id },
          el("td", { class: "mono" }, it.id),
          el("td", {}, statusBadge(it.status)),
          el("td", { "data-attempts": it.attempts }, toggle),
          el("td", {}, it.worker ? agentLink(it.worker) : ""),
          el("td", {}, it.last_error || ""),
          el("td", {}, it.result === null ? "" : el("pre", {}, JSON.stringify(it.result)))));
        if (open.has(it.id)) rows.push(await attemptsRow(id, it.id));
      }
      items.replaceChildren(...rows);
      showError("");
    } catch (e) {
      showError(String(e.message || e));
    }
  }
  const from = await lastSequence();
  await load();
  if (my !== scope) return;
  main.replaceChildren(head, el("section", { class: "card" }, el("h2", {}, "Items"), el("div", { class: "scroll" },
    el("table", {}, el("thead", {}, el("tr", {}, ...["item", "status", "attempts", "worker", "last error", "result"].map((h) => el("th", {}, h)))), items))));
  const reload = throttle(load, 500);
  follow(my, "type=job.*&after=" + enc(from), (e) => {
    if (!e || !e.payload || e.payload.job === undefined || e.payload.job === id) reload();
  });
}

// ---- routing -------------------------------------------------------------------

async function route() {
  for (const c of scope.cleanups) c();
  scope = { cleanups: [] };
  const my = scope;
  live.textContent = "offline";
  live.className = "live off";
  const h = location.hash.replace(/^#/, "") || "/";
  const parts = h.split("/").filter(Boolean).map(decodeURIComponent);
  document.getElementById("nav-tree").className = parts[0] === undefined || parts[0] === "agent" ? "here" : "";
  document.getElementById("nav-timeline").className = parts[0] === "timeline" ? "here" : "";
  document.getElementById("nav-jobs").className = parts[0] === "jobs" || parts[0] === "job" ? "here" : "";
  if (parts[0] === "agent" && parts[1]) {
    document.title = parts[1] + " · brood";
    await agentView(parts[1]);
  } else if (parts[0] === "timeline") {
    document.title = "timeline · brood";
    await timelineView();
  } else if (parts[0] === "jobs") {
    document.title = "jobs · brood";
    await jobsView();
  } else if (parts[0] === "job" && parts[1]) {
    document.title = "job " + parts[1] + " · brood";
    await jobView(parts[1]);
  } else {
    document.title = "brood";
    await treeView();
  }
  // Tests wait for this: the view asked for is drawn.
  if (my === scope) document.body.dataset.ready = h;
}

// Log out: the daemon ends this browser's session and drops its cookie;
// the page then shows what a visit without the token shows.
document.getElementById("logout").addEventListener("click", async () => {
  try {
    await post("/api/ui/logout", {});
  } catch (e) {
    showError("log out: " + e.message);
    return;
  }
  for (const c of scope.cleanups) c();
  location.replace("/ui");
});

window.addEventListener("hashchange", route);
route();
