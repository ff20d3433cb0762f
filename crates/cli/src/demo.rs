//! `brood demo`: brood's main job in under 30 seconds, offline.
//!
//! Part 1: a root agent fans out over a directory: one child per subdirectory,
//! one grandchild per file, each counting lines for real and reporting back; the
//! tree is drawn live. Part 2: the same shape, slower, and its root is killed with
//! SIGKILL mid-work: every descendant ends `cancelled (parent_dead)`, no process is
//! left, and a grandchild's transcript is still there to read. Part 3
//! (`demo::models`): a model-driven tree of `brood agent`s on a scripted model:
//! an explore child and a code child doing real work, a creation refused and
//! asked again for less, and each agent's own and subtree cost. Part 4
//! (`demo::jobs`): a job over a CSV with reused workers, retries, an export
//! and a verified evidence bundle.

mod jobs;
mod models;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use brood_core::AgentName;
use brood_runtime::{Caller, Config, SpawnRequest, Supervisor};

use crate::render;

fn write_data(dir: &Path, files: &[(&str, usize)]) -> Result<()> {
    for (rel, lines) in files {
        let p = dir.join(rel);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d)?;
        }
        let body: String = (1..=*lines)
            .map(|i| format!("line {i} of {rel}\n"))
            .collect();
        std::fs::write(&p, body).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn spawn_req(name: &str, argv: Vec<String>, task: &str) -> Result<SpawnRequest> {
    Ok(SpawnRequest {
        customer: None,
        label: None,
        placement: None,
        traceparent: None,
        name: Some(AgentName::new(name)?),
        parent: None,
        argv,
        protocol: brood_store::Protocol::Brood,
        task: task.to_owned(),
        env: Vec::new(),
        secrets: brood_api::Secrets::new(),
        cwd: None,
        session: brood_core::SessionName::default_session(),
        await_ready: true,
        policy: None,
        life: brood_core::Life::Owned,
        iso: brood_core::Iso::None,
        root: None,
    })
}

fn draw(sup: &Supervisor, name: &AgentName, tty: bool, title: &str) -> Result<()> {
    let t = sup
        .view()
        .tree(Some(name))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut out = std::io::stdout().lock();
    if tty {
        // Redraw in place on a terminal; plain snapshots otherwise.
        write!(out, "\x1b[H\x1b[2J")?;
    }
    writeln!(out, "{title}")?;
    if let Some(root) = t.trees.first() {
        write!(out, "{}", render::tree(root))?;
    }
    writeln!(out)?;
    out.flush()?;
    Ok(())
}

fn count_nodes(t: &brood_api::TreeNode, pred: &dyn Fn(&brood_api::Agent) -> bool) -> usize {
    usize::from(pred(&t.agent))
        + t.children
            .iter()
            .map(|k| count_nodes(k, pred))
            .sum::<usize>()
}

pub async fn run(root: Option<PathBuf>) -> Result<i32> {
    let t_start = Instant::now();
    let root = match root {
        Some(r) => r,
        None => std::env::temp_dir().join(format!("brood-demo-{}", std::process::id())),
    };
    std::fs::create_dir_all(&root)?;
    // The directories the agents count are outside brood's root: agents never
    // see inside the root but for its ctx/ tree (the veil,
    // docs/decisions/containment.md).
    let work = std::env::temp_dir().join(format!("brood-demo-data-{}", std::process::id()));
    let data = work.join("demo-data");
    write_data(
        &data,
        &[
            ("src/main.rs", 120),
            ("src/lib.rs", 80),
            ("src/util.rs", 45),
            ("docs/guide.md", 200),
            ("docs/faq.md", 35),
            ("notes.txt", 12),
        ],
    )?;
    let slow = work.join("demo-slow");
    write_data(
        &slow,
        &[
            ("a/one.txt", 10),
            ("a/two.txt", 20),
            ("b/three.txt", 30),
            ("b/four.txt", 40),
        ],
    )?;

    let mut cfg = Config::new(root.clone());
    let entrances = brood_server::Entrances::new();
    entrances.install(&mut cfg);
    cfg.grace = Duration::from_secs(1);
    cfg.bin_dir = crate::bin_dir();
    let sock = cfg.socket.clone();
    let listener = brood_server::bind_unix(&sock).await?;
    let sup = Supervisor::start(cfg).context("starting the supervisor")?;
    let api = brood_server::Api::new(sup.clone(), None);
    entrances.serve(&api);
    let server = tokio::spawn(brood_server::serve_unix(api, listener));
    // Whatever happens, the supervisor is shut down: nothing of the demo outlives it.
    let shown = show_trees(&sup, &data, &slow).await;
    let shown = match shown {
        Ok(()) => {
            let exe = std::env::current_exe()?.to_string_lossy().into_owned();
            let me = Caller::User {
                uid: crate::unsafe_uid(),
            };
            match models::part3(&sup, &me, &data, &work, &exe).await {
                Ok(()) => jobs::part4(&sup, &me, &root, &work, &exe).await,
                e => e,
            }
        }
        e => e,
    };
    sup.shutdown().await;
    server.abort();
    let _ = std::fs::remove_file(&sock);
    let _ = std::fs::remove_dir_all(&work);
    shown?;
    println!(
        "\ndemo finished in {:.1} s; state kept in {} (try: brood --root {} tree)",
        t_start.elapsed().as_secs_f64(),
        root.display(),
        root.display()
    );
    Ok(0)
}

/// What the first grandchild handed back to its parent (SPEC 4): the channel's
/// files, the artifact and the blob it was kept as.
fn show_channel(sup: &Supervisor, root: &AgentName) -> Result<()> {
    let descendants = sup.store().descendants_post_order(sup.tenant(), root)?;
    let Some(gc) = descendants.iter().find(|a| a.depth == 2) else {
        return Ok(());
    };
    let Some(p) = &gc.parent else { return Ok(()) };
    let pa = sup.view().agent(p).map_err(|e| anyhow::anyhow!("{e}"))?;
    let cdir = sup.paths().channel_dir(p, &pa.session, &gc.name);
    println!(
        "\nwhat {} handed back to {p}, as files in {p}'s channel ({}):",
        gc.name,
        cdir.display()
    );
    for f in [
        "handoff.md",
        "status",
        "result.md",
        "refs.jsonl",
        "artifact/lines.txt",
    ] {
        let body = std::fs::read_to_string(cdir.join(f)).unwrap_or_default();
        println!("--- {f}");
        println!("{}", body.trim_end());
    }
    if let Some(ch) = sup.store().channel(sup.tenant(), p, &gc.name)?
        && let Some(a) = ch.artifacts.first()
    {
        println!(
            "--- kept as {} ({} bytes), so `brood fsck` can rebuild it",
            brood_runtime::channel::blob_path(&sup.paths().blobs(), &a.sha256).display(),
            a.size
        );
    }
    Ok(())
}

/// The two parts of the demo, on a running supervisor.
async fn show_trees(sup: &Supervisor, data: &Path, slow: &Path) -> Result<()> {
    let exe = std::env::current_exe()?.to_string_lossy().into_owned();
    let me = Caller::User {
        uid: crate::unsafe_uid(),
    };
    let tty = std::io::stdout().is_terminal();
    let tag = format!("{:x}", std::process::id());

    // Part 1: a tree doing real work, drawn live.
    let counter = AgentName::new(&format!("count-{tag}"))?;
    let argv = vec![
        exe.clone(),
        "test-agent".into(),
        "--count-lines".into(),
        data.to_string_lossy().into_owned(),
        "--fanout".into(),
        "--hand-back".into(),
        "--work-ms".into(),
        "1500".into(),
    ];
    crate::api(
        sup.spawn(
            me.clone(),
            spawn_req(
                counter.as_str(),
                argv,
                "count the lines of every file under demo-data",
            )?,
        )
        .await,
    )?;
    let title = "brood demo, part 1: a root fans out to children (one per directory) and grandchildren (one per file)";
    // Live frames are for a terminal; a pipe or a file gets each part's
    // final tree once.
    loop {
        if tty {
            draw(sup, &counter, tty, title)?;
        }
        let a = sup
            .view()
            .agent(&counter)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if a.status.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    crate::api(sup.wait(me.clone(), vec![counter.clone()], None).await)?;
    sup.flush().await;
    draw(sup, &counter, tty, title)?;
    let shown = sup
        .view()
        .show(&counter)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    println!(
        "result of {counter}:\n{}",
        shown.agent.result.as_deref().unwrap_or("(none)")
    );
    show_channel(sup, &counter)?;

    // Part 2: the same shape, slow; its root is SIGKILLed mid-work.
    let doomed = AgentName::new(&format!("doomed-{tag}"))?;
    let argv = vec![
        exe.clone(),
        "test-agent".into(),
        "--count-lines".into(),
        slow.to_string_lossy().into_owned(),
        "--fanout".into(),
        "--work-ms".into(),
        "60000".into(),
    ];
    crate::api(
        sup.spawn(
            me.clone(),
            spawn_req(
                doomed.as_str(),
                argv,
                "count slowly (this tree will be killed)",
            )?,
        )
        .await,
    )?;
    println!();
    let title2 = "brood demo, part 2: a second tree, whose root will be killed with SIGKILL";
    if !tty {
        println!("{title2}");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let running = loop {
        let t = sup
            .view()
            .tree(Some(&doomed))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let running = t
            .trees
            .first()
            .map_or(0, |t| count_nodes(t, &|a| a.status == "running"));
        if tty {
            draw(sup, &doomed, tty, title2)?;
        }
        // root + 2 children + 4 grandchildren
        if running >= 7 || Instant::now() > deadline {
            break running;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let pid = sup
        .view()
        .show(&doomed)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .agent
        .pid
        .context("the doomed root has no pid")?;
    println!(
        "kill -9 {pid}   (the root agent {doomed}, with {running} agents of its tree running)"
    );

    let descendants: Vec<AgentName> = sup
        .store()
        .descendants_post_order(sup.tenant(), &doomed)?
        .into_iter()
        .map(|a| a.name)
        .collect();
    let mut all = descendants.clone();
    all.push(doomed.clone());
    // The processes of the tree before the kill, to look for afterwards.
    let mut pids = Vec::new();
    for n in &all {
        let a = sup
            .view()
            .show(n)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .agent;
        pids.extend(a.pid);
    }

    // SAFETY: sending SIGKILL to the agent process this demo started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    crate::api(
        sup.wait(me.clone(), all, Some(Duration::from_secs(10)))
            .await,
    )?;
    sup.flush().await;
    let title = after_the_kill(sup, &descendants, &pids).await?;
    draw(sup, &doomed, false, &title)?;
    if let Some(gc) = descendants.first() {
        let a = sup.view().agent(gc).map_err(|e| anyhow::anyhow!("{e}"))?;
        let dir = sup.paths().session_dir(gc, &a.session);
        println!("the transcript of {gc} is still there ({}):", dir.display());
        for f in ["messages.jsonl", "events.jsonl", "state"] {
            let body = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
            println!("--- {f}");
            print!("{body}");
        }
        if let Some(p) = &a.parent {
            let pa = sup.view().agent(p).map_err(|e| anyhow::anyhow!("{e}"))?;
            let cdir = sup.paths().channel_dir(p, &pa.session, gc);
            println!("--- {}/result.md", cdir.display());
            print!(
                "{}",
                std::fs::read_to_string(cdir.join("result.md")).unwrap_or_default()
            );
            println!("--- the parent's events.jsonl ({p})");
            print!(
                "{}",
                std::fs::read_to_string(
                    sup.paths().session_dir(p, &pa.session).join("events.jsonl")
                )
                .unwrap_or_default()
            );
        }
    }
    Ok(())
}

/// What the kill left, looked at rather than assumed: how many of the
/// root's descendants the store records `cancelled (parent_dead)`, and how
/// many of the tree's processes are left. Anything else is the demo failing.
async fn after_the_kill(
    sup: &Supervisor,
    descendants: &[AgentName],
    pids: &[i64],
) -> Result<String> {
    let mut cancelled = 0;
    for n in descendants {
        let a = sup
            .view()
            .show(n)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .agent;
        anyhow::ensure!(
            a.status == "cancelled" && a.reason.as_deref() == Some("parent_dead"),
            "after the SIGKILL, {n} is {} ({}), not cancelled (parent_dead)",
            a.status,
            a.reason.as_deref().unwrap_or("no reason")
        );
        cancelled += 1;
    }
    // A process is gone when /proc has no entry for it; a zombie still has one.
    let deadline = Instant::now() + Duration::from_secs(10);
    let left = loop {
        let left: Vec<i64> = pids
            .iter()
            .copied()
            .filter(|p| Path::new(&format!("/proc/{p}")).exists())
            .collect();
        if left.is_empty() || Instant::now() > deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    anyhow::ensure!(
        left.is_empty(),
        "after the SIGKILL, processes of the tree are still there: {left:?}"
    );
    Ok(format!(
        "after the SIGKILL: {cancelled} of {} descendants cancelled (parent_dead), {} of {} processes left",
        descendants.len(),
        left.len(),
        pids.len()
    ))
}
