//! Part 3 of the demo: a model-driven tree, offline. `brood agent` replays
//! scripted model turns (the script provider), so the run is deterministic,
//! but everything else is real: the lead creates an `explore` child and a
//! `code` child through brood, one creation is refused for asking more than
//! the lead holds and the lead asks again for less, the children's tools do
//! real work on the demo's files inside their sandboxes, and every model call
//! is priced, so the tree shows each agent's own and subtree cost.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use brood_core::AgentName;
use brood_runtime::{Caller, Supervisor};
use serde_json::{Value, json};

use super::{draw, spawn_req};

fn turn(text: &str, calls: Vec<Value>, input: u64, output: u64) -> Value {
    json!({"text": text, "tool_calls": calls, "usage": {"input": input, "output": output}})
}

fn call(name: &str, args: Value) -> Value {
    json!({"name": name, "arguments": args})
}

/// The script every agent of part 3 plays its part of.
fn script(data: &Path) -> Value {
    let d = data.display().to_string();
    let src = format!("{d}/src");
    let ro = json!([{"path": "/", "mode": "ro"}]);
    let writer = |tools: Value| {
        call(
            "create",
            json!({
                "name": "writer", "type": "code",
                "task": format!("Count the lines of every Rust file in {src} and write the counts to {d}/SUMMARY.txt."),
                "capabilities": {"tools": tools, "files": [{"path": "/", "mode": "ro"}, {"path": d, "mode": "rw"}]},
            }),
        )
    };
    json!({"agents": {
        "lead": [
            turn("I will have a scout look at the sources and a writer summarise them.", vec![
                call("create", json!({
                    "name": "scout", "type": "explore",
                    "task": format!("Find the Rust files under {d} and what they define."),
                    "capabilities": {"tools": ["file_tree", "file_search", "file_read"], "files": ro},
                })),
                writer(json!(["file_read", "file_write", "shell", "code_exec"])),
            ], 1200, 160),
            turn("The writer may not have code_exec: I do not hold it. Asking for less.", vec![
                writer(json!(["file_read", "file_write", "shell"])),
            ], 1500, 90),
            turn("", vec![call("wait", json!({"names": ["scout", "writer"], "timeout_s": 30}))], 1600, 40),
            turn("The scout mapped the sources and the writer left the line counts in SUMMARY.txt.", vec![], 2100, 60),
        ],
        "explore": [
            turn("Looking at the tree first.", vec![call("file_tree", json!({"path": d, "depth": 2}))], 800, 40),
            turn("", vec![call("file_search", json!({"pattern": "^line 1 ", "path": src, "glob": "*.rs"}))], 950, 35),
            turn("Three Rust files under src/: main.rs, lib.rs and util.rs.", vec![], 1100, 30),
        ],
        "code": [
            turn("Counting with wc.", vec![call("shell", json!({"command": format!("cd {src} && wc -l *.rs > {d}/SUMMARY.txt && cat {d}/SUMMARY.txt")}))], 700, 50),
            turn("", vec![call("file_read", json!({"path": format!("{d}/SUMMARY.txt")}))], 820, 20),
            turn(&format!("Wrote {d}/SUMMARY.txt."), vec![], 900, 25),
        ],
    }})
}

pub(super) async fn part3(
    sup: &Supervisor,
    me: &Caller,
    data: &Path,
    work: &Path,
    exe: &str,
) -> Result<()> {
    let script_path = work.join("model-script.json");
    std::fs::write(&script_path, script(data).to_string())?;
    let config = work.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "provider = \"script\"\nmodel = \"demo-model\"\nscript = \"{}\"\n\n[prices.demo-model]\ninput_per_mtok = 3.0\noutput_per_mtok = 15.0\n",
            script_path.display()
        ),
    )?;
    let lead = AgentName::new("lead")?;
    let mut r = spawn_req(
        lead.as_str(),
        vec![
            exe.to_owned(),
            "agent".into(),
            "--config".into(),
            config.display().to_string(),
        ],
        "Map the demo's sources and summarise their size.",
    )?;
    // What the lead holds; its children may hold no more.
    r.policy = Some(json!({
        "tools": ["create", "wait", "file_read", "file_write", "file_tree", "file_search", "shell"],
        "files": [{"path": "/", "mode": "ro"}, {"path": data.display().to_string(), "mode": "rw"}],
    }));
    r.await_ready = false;
    crate::api(sup.spawn(me.clone(), r).await)?;
    crate::api(
        sup.wait(
            me.clone(),
            vec![lead.clone()],
            Some(Duration::from_secs(20)),
        )
        .await,
    )?;
    sup.flush().await;
    println!();
    draw(
        sup,
        &lead,
        false,
        "brood demo, part 3: a model-driven tree (scripted model, real tools, priced turns)",
    )?;
    // The refusal, as the lead's model read it.
    let refusal = sup
        .store()
        .messages(
            sup.tenant(),
            &lead,
            &brood_core::SessionName::default_session(),
        )?
        .into_iter()
        .filter(|m| m.role == "tool")
        .find_map(|m| {
            let v: Value = serde_json::from_str(&m.content).ok()?;
            let c = v["content"].as_str()?.to_owned();
            c.contains("refused").then_some(c)
        });
    if let Some(r) = refusal {
        println!("the lead asked too much once, and was told: {r}");
    }
    let summary =
        std::fs::read_to_string(data.join("SUMMARY.txt")).context("the writer's SUMMARY.txt")?;
    println!(
        "--- SUMMARY.txt, written by the writer's shell tool\n{}",
        summary.trim_end()
    );
    Ok(())
}
