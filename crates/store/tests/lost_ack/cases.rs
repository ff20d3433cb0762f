//! Every kind of write the store makes on PostgreSQL, each a case: what it
//! needs first, then the write whose commit the proxy may lose (after
//! `ctx.arm()`), and its answer as text (with what only the write itself
//! shows, as an inbox taken or a blob read back; the rest is the harness's
//! `state`).

use brood_core::{ItemStatus, JobStatus, Quotas, Status, Terminal};
use brood_store::prelude::*;
use brood_store::{EndItem, IdempotentReply, NewItem, NewJob, NewNode, RunEnd};
use brood_store_conformance::{event, name};

use super::Ctx;

/// One write: its name, which of its commits to lose (1: its first), and
/// the case.
pub type Case = (&'static str, usize, fn(&Ctx<'_>) -> String);

const USER: Terminal = Terminal::Cancelled(brood_core::CancelReason::User);

fn job(ctx: &Ctx<'_>, id: &str, items: &[&str]) -> (NewJob, Vec<NewItem>) {
    let new = NewJob {
        tenant: ctx.t.clone(),
        id: id.to_owned(),
        owner: name("owner"),
        spec: r#"{"instruction": "summarise {text}"}"#.to_owned(),
        source: None,
        created_ms: ctx.now(),
    };
    let items = items
        .iter()
        .enumerate()
        .map(|(i, id)| NewItem {
            id: (*id).to_owned(),
            row_index: u32::try_from(i).unwrap(),
            input: format!(r#"{{"text": "row {i}"}}"#),
        })
        .collect();
    (new, items)
}

/// A running owner and job `j` of one item `a`, created and running.
fn running_job(ctx: &Ctx<'_>) {
    let owner = ctx.running("owner", None);
    let (new, items) = job(ctx, "j", &["a"]);
    let s = ctx.store;
    s.create_job(&new, &items, &[]).unwrap();
    s.set_job_status(&ctx.t, "j", JobStatus::Running, ctx.now(), &[])
        .unwrap();
    let _ = owner;
}

fn node(ctx: &Ctx<'_>, n: &str) -> NewNode {
    NewNode {
        id: format!("{}-{n}", ctx.t),
        address: format!("/run/{}-{n}.sock", ctx.t),
        labels: r#"{"zone":"a"}"#.into(),
        capacity: Some(8),
    }
}

fn end_of(ctx: &Ctx<'_>, outcome: Terminal) -> RunEnd {
    RunEnd {
        outcome,
        exit_code: Some(0),
        result: Some("done".into()),
        detail: None,
        now_ms: ctx.now(),
        output: None,
    }
}

pub const CASES: &[Case] = &[
    ("admit a root", 1, |ctx| {
        let new = ctx.new_agent("root", None);
        ctx.arm();
        format!("{:?}", ctx.store.admit(&new, &ctx.spawn_events(&new)))
    }),
    ("admit a child with quotas", 1, |ctx| {
        ctx.running("root", None);
        let new = ctx.new_agent("kid", Some("root"));
        ctx.arm();
        let q = Quotas::CEILINGS;
        let r = ctx
            .store
            .admit_with_quotas(&new, &q, &ctx.spawn_events(&new));
        format!("{r:?}")
    }),
    ("an admission refused commits its group", 1, |ctx| {
        ctx.admit("root", None);
        let again = ctx.new_agent("root", None);
        ctx.arm();
        format!("{:?}", ctx.store.admit(&again, &[]))
    }),
    ("set a tenant's quota", 1, |ctx| {
        ctx.arm();
        let r = ctx.store.set_tenant_quota(&ctx.t, "max_fanout", 3);
        format!("{r:?}")
    }),
    ("start a run", 1, |ctx| {
        let a = ctx.admit("root", None);
        ctx.arm();
        format!("{:?}", ctx.try_start(&a))
    }),
    ("start a run its supervisor names", 1, |ctx| {
        let a = ctx.admit("root", None);
        ctx.arm();
        let it = brood_store::StartItem {
            name: a.name.clone(),
            run: a.run.clone(),
            pid: 4242,
            cgroup: format!("/cg/{}", a.name),
            now_ms: ctx.now(),
            events: vec![event(&a.name, Some(&a.run), "agent.start")],
            supervisor: Some(a.supervisor.clone()),
        };
        format!("{:?}", ctx.store.start_one(&ctx.t, &it))
    }),
    ("change a status", 1, |ctx| {
        let a = ctx.running("root", None);
        ctx.arm();
        let ev = [event(&a.name, Some(&a.run), "agent.blocked")];
        let r = ctx.store.set_status(
            &ctx.t,
            &a.name,
            Status::Blocked,
            Some("waiting"),
            ctx.now(),
            &ev,
        );
        format!("{r:?}")
    }),
    ("mark a stop", 1, |ctx| {
        let a = ctx.running("root", None);
        let b = ctx.admit("kid", Some("root"));
        ctx.arm();
        let names = [a.name, b.name];
        let r = ctx.store.mark_stopping(&ctx.t, &names, USER, ctx.now());
        format!("{r:?}")
    }),
    ("end a run", 1, |ctx| {
        let a = ctx.running("root", None);
        ctx.arm();
        let ev = [event(&a.name, Some(&a.run), "agent.stop")];
        let end = end_of(ctx, Terminal::Completed);
        let r = ctx.store.end_run(&ctx.t, &a.name, &a.run, &end, &ev);
        format!("{r:?}")
    }),
    ("end the runs of a stop", 1, |ctx| {
        let a = ctx.running("root", None);
        let b = ctx.running("kid", Some("root"));
        ctx.store
            .mark_stopping(&ctx.t, &[a.name.clone(), b.name.clone()], USER, ctx.now())
            .unwrap();
        let items: Vec<EndItem> = [&b, &a]
            .iter()
            .map(|x| EndItem {
                name: x.name.clone(),
                run: x.run.clone(),
                end: Some(end_of(ctx, USER)),
                events: vec![event(&x.name, Some(&x.run), "agent.stop")],
                now_ms: ctx.now(),
            })
            .collect();
        ctx.arm();
        format!("{:?}", ctx.store.end_runs(&ctx.t, &items))
    }),
    ("record usage", 1, |ctx| {
        let a = ctx.running("root", None);
        ctx.arm();
        let r = ctx.store.record_usage(&ctx.t, &a.run, 10, 20, 0.5);
        format!("{r:?} {:?}", ctx.store.spend(&ctx.t, &a.name))
    }),
    ("resume", 1, |ctx| {
        let a = ctx.running("root", None);
        ctx.end(&a, Terminal::Completed);
        let run = ctx.run();
        ctx.arm();
        let ev = [event(&a.name, Some(&run), "agent.resume")];
        let r = ctx
            .store
            .resume(&ctx.t, &a.name, &run, "sup", ctx.now(), &ev);
        format!("{r:?}")
    }),
    ("resume within quotas", 1, |ctx| {
        ctx.running("root", None);
        let b = ctx.running("kid", Some("root"));
        ctx.end(&b, Terminal::Completed);
        let run = ctx.run();
        ctx.arm();
        let q = Quotas::CEILINGS;
        let r = ctx
            .store
            .resume_within(&ctx.t, &b.name, &run, "sup", ctx.now(), &q, &[]);
        format!("{r:?}")
    }),
    ("append a message", 1, |ctx| {
        let a = ctx.running("root", None);
        ctx.arm();
        let r = ctx.store.append_message(
            &ctx.t,
            &a.name,
            &a.session,
            &a.run,
            "user",
            "hello",
            ctx.now(),
        );
        format!("{r:?}")
    }),
    ("append events", 1, |ctx| {
        let a = ctx.running("root", None);
        ctx.arm();
        let ev = [
            event(&a.name, Some(&a.run), "agent.note"),
            event(&a.name, None, "agent.other"),
        ];
        format!("{:?}", ctx.store.append_events(&ctx.t, &ev, ctx.now()))
    }),
    ("recover a dead supervisor's agents", 1, |ctx| {
        ctx.running("root", None);
        ctx.admit("kid", Some("root"));
        ctx.arm();
        let r = ctx.store.recover(&[ctx.supervisor()], ctx.now());
        format!("{r:?}")
    }),
    ("recover a lost node's agents", 1, |ctx| {
        ctx.running("root", None);
        ctx.arm();
        let r = ctx.store.recover_lost(&[ctx.supervisor()], ctx.now());
        format!("{r:?}")
    }),
    ("take the sweepers' lease", 1, |ctx| {
        let lease = ctx.t.to_string();
        ctx.store.acquire_lease(&lease, "old", ctx.now()).unwrap();
        ctx.arm();
        let r = ctx.store.acquire_lease(&lease, "me", ctx.now());
        format!("{r:?} {:?}", ctx.store.lease(&lease))
    }),
    ("a sweeper's stop", 1, |ctx| {
        let a = ctx.running("root", None);
        let fence = ctx
            .store
            .acquire_lease(ctx.t.as_str(), "me", ctx.now())
            .unwrap();
        ctx.arm();
        let ev = [event(&a.name, Some(&a.run), "agent.timeout")];
        let r = ctx.store.sweep_stop(
            &fence,
            &ctx.t,
            std::slice::from_ref(&a.name),
            Terminal::Failed(brood_core::FailReason::TimedOut),
            ctx.now(),
            &ev,
        );
        format!("{r:?}")
    }),
    ("a sweeper's end", 1, |ctx| {
        let a = ctx.running("root", None);
        let fence = ctx
            .store
            .acquire_lease(ctx.t.as_str(), "me", ctx.now())
            .unwrap();
        ctx.arm();
        let end = end_of(ctx, Terminal::Failed(brood_core::FailReason::Lost));
        let r = ctx.store.sweep_end(&fence, &ctx.t, &a.name, &end, &[]);
        format!("{r:?}")
    }),
    ("keep an idempotency key's answer", 1, |ctx| {
        let at = ctx.now();
        let reply = IdempotentReply {
            tenant: ctx.t.clone(),
            caller: "user:0".into(),
            key: "k1".into(),
            scope: "user:0 POST /api/agents".into(),
            request_hash: "hash".into(),
            status: 201,
            body: "first".into(),
            created_ms: at,
            expires_ms: at + 60_000,
        };
        ctx.arm();
        let r = ctx.store.keep_idempotent_reply(&reply, at);
        let kept = ctx.store.idempotent_reply(&ctx.t, "user:0", "k1", at);
        format!("{r:?} {kept:?}")
    }),
    ("create a job", 1, |ctx| {
        let owner = ctx.running("owner", None);
        let (new, items) = job(ctx, "j", &["a", "b"]);
        ctx.arm();
        let ev = [event(&owner.name, None, "job.created")];
        format!("{:?}", ctx.store.create_job(&new, &items, &ev))
    }),
    ("change a job's status", 1, |ctx| {
        let owner = ctx.running("owner", None);
        let (new, items) = job(ctx, "j", &["a"]);
        ctx.store.create_job(&new, &items, &[]).unwrap();
        ctx.arm();
        let ev = [event(&owner.name, None, "job.started")];
        let r = ctx
            .store
            .set_job_status(&ctx.t, "j", JobStatus::Running, ctx.now(), &ev);
        format!("{r:?}")
    }),
    ("start an attempt", 1, |ctx| {
        running_job(ctx);
        ctx.arm();
        let r = ctx
            .store
            .start_attempt(&ctx.t, "j", "a", &name("w1"), ctx.now(), &[]);
        format!("{r:?}")
    }),
    ("report a result", 1, |ctx| {
        running_job(ctx);
        let w = name("w1");
        ctx.store
            .start_attempt(&ctx.t, "j", "a", &w, ctx.now(), &[])
            .unwrap();
        ctx.arm();
        let r = ctx
            .store
            .report_result(&ctx.t, "j", "a", 1, &w, r#"{"ok":true}"#, ctx.now(), &[]);
        format!("{r:?}")
    }),
    ("fail an attempt", 1, |ctx| {
        running_job(ctx);
        ctx.store
            .start_attempt(&ctx.t, "j", "a", &name("w1"), ctx.now(), &[])
            .unwrap();
        ctx.arm();
        let r = ctx
            .store
            .fail_attempt(&ctx.t, "j", "a", 1, "crashed", 3, ctx.now(), &[]);
        format!("{r:?}")
    }),
    ("retry an item", 1, |ctx| {
        running_job(ctx);
        let s = ctx.store;
        s.start_attempt(&ctx.t, "j", "a", &name("w1"), ctx.now(), &[])
            .unwrap();
        s.fail_attempt(&ctx.t, "j", "a", 1, "crashed", 1, ctx.now(), &[])
            .unwrap();
        ctx.arm();
        let r = s.retry_item(&ctx.t, "j", "a", ctx.now(), &[]);
        let pending = s.job_items(&ctx.t, "j", Some(ItemStatus::Pending));
        format!("{r:?} {pending:?}")
    }),
    ("register a node", 1, |ctx| {
        let n = node(ctx, "a");
        ctx.arm();
        // Its times are the store's clock's: the rest is compared.
        let r = ctx.store.register_node(&n).map(|n| (n.id, n.address));
        format!("{r:?}")
    }),
    ("a node leaves", 1, |ctx| {
        let n = node(ctx, "a");
        ctx.store.register_node(&n).unwrap();
        ctx.arm();
        format!("{:?}", ctx.store.leave_node(&n.id))
    }),
    ("claim placed agents", 1, |ctx| {
        let n = node(ctx, "a").id;
        ctx.admit_on("p1", &brood_store::placed_on(&n));
        ctx.admit_on("p2", &brood_store::placed_on(&n));
        ctx.arm();
        format!("{:?}", ctx.store.claim_placed(&ctx.t, &n, 10))
    }),
    ("move a lost node's queue", 1, |ctx| {
        let (a, b) = (node(ctx, "a").id, node(ctx, "b").id);
        let p = ctx.admit_on("p1", &a);
        ctx.arm();
        let r = ctx.store.replace_queued(&ctx.t, &p.name, &a, &b);
        format!("{r:?}")
    }),
    ("post an input", 1, |ctx| {
        let host = node(ctx, "a").id;
        ctx.arm();
        let (t, kid) = (&ctx.t, name("kid"));
        let r = ctx
            .store
            .post_input(t, &kid, &host, "user:0", "hi", ctx.now());
        format!("{r:?} {:?}", ctx.store.take_inputs(t, &host, 10))
    }),
    ("take inputs", 1, |ctx| {
        let host = node(ctx, "a").id;
        let (t, kid) = (&ctx.t, name("kid"));
        for text in ["one", "two"] {
            ctx.store
                .post_input(t, &kid, &host, "user:0", text, ctx.now())
                .unwrap();
        }
        ctx.arm();
        let r = ctx.store.take_inputs(t, &host, 10);
        format!("{r:?} then {:?}", ctx.store.take_inputs(t, &host, 10))
    }),
    ("put a blob: its chunk", 1, |ctx| put_blob(ctx)),
    ("put a blob: its head", 2, |ctx| put_blob(ctx)),
    ("take a concurrency slot", 1, |ctx| {
        ctx.arm();
        let r = ctx.store.slot_acquire(&ctx.t, "sup-a", 4);
        format!("{r:?}")
    }),
    ("give a slot back", 1, |ctx| {
        ctx.store.slot_acquire(&ctx.t, "sup-a", 4).unwrap();
        ctx.store.slot_acquire(&ctx.t, "sup-a", 4).unwrap();
        ctx.arm();
        format!("{:?}", ctx.store.slot_release(&ctx.t, "sup-a"))
    }),
    ("repair a share", 1, |ctx| {
        ctx.store.slot_acquire(&ctx.t, "sup-a", 4).unwrap();
        ctx.arm();
        format!("{:?}", ctx.store.slot_repair(&ctx.t, "sup-a", 3))
    }),
    ("forget gone holders' shares", 1, |ctx| {
        ctx.store.slot_acquire(&ctx.t, "sup-a", 4).unwrap();
        ctx.store.slot_acquire(&ctx.t, "sup-b", 4).unwrap();
        ctx.arm();
        let r = ctx.store.slot_forget(&ctx.t, &["sup-a".to_owned()]);
        format!("{r:?}")
    }),
    ("remove a finished tree", 1, |ctx| {
        let a = ctx.running("root", None);
        let b = ctx.running("kid", Some("root"));
        ctx.end(&b, Terminal::Completed);
        ctx.end(&a, Terminal::Completed);
        ctx.arm();
        format!("{:?}", ctx.store.remove_tree(&ctx.t, &a.name))
    }),
    ("remove a job", 1, |ctx| {
        let owner = ctx.running("owner", None);
        let (new, items) = job(ctx, "j", &["a"]);
        ctx.store.create_job(&new, &items, &[]).unwrap();
        ctx.arm();
        let ev = [event(&owner.name, None, "job.removed")];
        let r = ctx.store.remove_job(&ctx.t, "j", ctx.now(), &ev);
        format!("{r:?}")
    }),
];

/// A blob of one chunk: its chunk's commit, then its head's.
fn put_blob(ctx: &Ctx<'_>) -> String {
    let bytes = b"the bytes of an artifact".to_vec();
    let sha = "ab".repeat(32);
    ctx.arm();
    let r = ctx
        .store
        .put_blob(&ctx.t, &sha, bytes.len() as u64, &mut &bytes[..]);
    let mut back = Vec::new();
    let whole = ctx.store.get_blob(&ctx.t, &sha, &mut back);
    format!("{r:?} {whole:?} {}", String::from_utf8_lossy(&back))
}
