//! The driver: random work asked of random nodes through their APIs. Trees
//! of the test agent (roots whose children hand back results and
//! artifacts, some with grandchildren, some failing), roots that wait for an
//! input and the inputs sent them, cancels, roots that fail, trees that hang
//! until cancelled, and small CSV jobs worked by `brood test-agent
//! --job-worker`. A call that fails is counted, never fatal: under faults
//! refusals are expected; what must hold is checked afterwards.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::http;
use crate::report::Report;
use crate::rng::Rng;
use crate::world::{World, agent};

pub struct Driver {
    /// Names start with it: each campaign's are its own.
    prefix: String,
    n: u64,
    /// Every root created (answered 201), with the node asked.
    pub roots: Vec<String>,
    waiting_input: Vec<String>,
    /// Roots that hold their slots until cancelled (hanging trees): most
    /// cancels go to them, or the tenant's slots would all be held.
    hanging: Vec<String>,
    /// Jobs created: id and owner.
    pub jobs: Vec<(String, String)>,
    /// Those whose owner is not cancelled yet.
    open_jobs: Vec<(String, String)>,
    /// What every `out.txt` of a tree must hold, by its root.
    pub artifact_of: BTreeMap<String, String>,
}

/// A call's deadline: long enough for a node that waits 2 s on its store
/// before it refuses.
const CALL: Duration = Duration::from_secs(8);

impl Driver {
    pub fn new(prefix: &str) -> Driver {
        Driver {
            prefix: prefix.to_owned(),
            n: 0,
            roots: Vec::new(),
            waiting_input: Vec::new(),
            hanging: Vec::new(),
            jobs: Vec::new(),
            open_jobs: Vec::new(),
            artifact_of: BTreeMap::new(),
        }
    }

    fn name(&mut self) -> String {
        self.n += 1;
        format!("{}{}", self.prefix, self.n)
    }

    /// One call through node `node`; the answer when 2xx, counted otherwise.
    fn ask(
        world: &World,
        report: &mut Report,
        node: usize,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Option<Value> {
        match http::call(&world.nodes[node].sock(), method, path, body, CALL) {
            Ok(a) if (200..300).contains(&a.status) => Some(a.json()),
            Ok(a) => {
                *report.refused.entry(a.status).or_default() += 1;
                if a.status == 500 && report.internal.len() < 5 {
                    let text: String = a.text().chars().take(300).collect();
                    report.internal.push(format!("{method} {path}: {text}"));
                }
                None
            }
            Err(_) => {
                *report.refused.entry(0).or_default() += 1;
                None
            }
        }
    }

    /// One random step through a random usable node.
    pub fn step(&mut self, world: &World, rng: &mut Rng, report: &mut Report) {
        let usable = world.usable();
        let Some(&node) = rng.pick(&usable) else {
            return;
        };
        report.steps += 1;
        match rng.below(100) {
            0..=29 => self.tree(world, rng, report, node),
            30..=41 => self.input_root(world, report, node),
            42..=56 => self.send_input(world, rng, report, node),
            57..=68 => self.cancel(world, rng, report, node),
            69..=79 => self.job(world, report, node),
            80..=87 => self.failing_root(world, rng, report, node),
            _ => self.hanging_tree(world, rng, report, node),
        }
    }

    fn create(
        &mut self,
        world: &World,
        report: &mut Report,
        node: usize,
        body: Value,
    ) -> Option<Value> {
        let name = body["name"].as_str().unwrap_or("").to_owned();
        let made = Self::ask(world, report, node, "POST", "/api/agents", Some(&body))?;
        self.roots.push(name);
        Some(made)
    }

    /// Sometimes a placement on a node chosen at random (maybe one that is
    /// down: the agent waits `queued` for it, or is placed again).
    fn placement(world: &World, rng: &mut Rng) -> Option<Value> {
        rng.chance(0.3).then(|| {
            let z = world.nodes[rng.below(world.nodes.len() as u64) as usize].zone();
            json!({"labels": {"zone": z}})
        })
    }

    fn tree(&mut self, world: &World, rng: &mut Rng, report: &mut Report, node: usize) {
        let name = self.name();
        let content = format!("artifact of {name}");
        let leaf = |what: &str, rng: &mut Rng| {
            agent(&[
                "--artifact",
                &format!("out.txt={content}"),
                "--result",
                &format!("{what} of {name}"),
                "--sleep-ms",
                &rng.between(100, 1500).to_string(),
            ])
        };
        let child_argv = match rng.below(10) {
            0..=4 => leaf("child", rng),
            5..=7 => {
                let g = json!({"argv": leaf("grandchild", rng)}).to_string();
                let mut argv = agent(&["--spawn-n", &format!("{}:{g}", rng.between(1, 3))]);
                argv.extend(
                    ["--tolerate-refusal", "--wait", "--artifact"]
                        .iter()
                        .map(|s| (*s).to_owned()),
                );
                argv.push(format!("out.txt={content}"));
                argv.push("--result".into());
                argv.push(format!("child of {name}"));
                argv
            }
            8 => agent(&["--crash"]),
            _ => agent(&["--error", "the child failed on purpose", "--exit", "3"]),
        };
        let mut child = json!({"name": format!("{name}-c"), "argv": child_argv});
        if let Some(p) = Self::placement(world, rng) {
            child["placement"] = p;
        }
        let argv = agent(&[
            "--spawn-n",
            &format!("{}:{child}", rng.between(2, 4)),
            "--tolerate-refusal",
            "--wait",
            "--result",
            &format!("root {name}"),
        ]);
        let mut body = json!({"name": name, "argv": argv});
        if let Some(p) = Self::placement(world, rng) {
            body["placement"] = p;
        }
        if self.create(world, report, node, body).is_some() {
            report.trees += 1;
            self.artifact_of.insert(name, content);
        }
    }

    fn input_root(&mut self, world: &World, report: &mut Report, node: usize) {
        let name = self.name();
        let argv = agent(&["--inputs", "1", "--result", &format!("input root {name}")]);
        if self
            .create(world, report, node, json!({"name": name, "argv": argv}))
            .is_some()
        {
            report.trees += 1;
            self.waiting_input.push(name);
        }
    }

    fn send_input(&mut self, world: &World, rng: &mut Rng, report: &mut Report, node: usize) {
        if self.waiting_input.is_empty() {
            return;
        }
        let i = rng.below(self.waiting_input.len() as u64) as usize;
        let name = self.waiting_input[i].clone();
        let body = json!({"text": format!("hello {name}")});
        let path = format!("/api/agents/{name}/input");
        if Self::ask(world, report, node, "POST", &path, Some(&body)).is_some() {
            self.waiting_input.swap_remove(i);
        }
    }

    fn cancel(&mut self, world: &World, rng: &mut Rng, report: &mut Report, node: usize) {
        // A job's owner once its job is over; else any root.
        let mut target = None;
        for (job, owner) in &self.open_jobs {
            let path = format!("/api/jobs/{job}");
            if let Some(v) = Self::ask(world, report, node, "GET", &path, None)
                && ["completed", "failed", "cancelled"]
                    .contains(&v["status"].as_str().unwrap_or(""))
            {
                target = Some(owner.clone());
                break;
            }
        }
        let target = match target {
            Some(t) => t,
            None if !self.hanging.is_empty() && rng.chance(0.7) => {
                let i = rng.below(self.hanging.len() as u64) as usize;
                self.hanging.swap_remove(i)
            }
            None => match rng.pick(&self.roots) {
                Some(t) => t.clone(),
                None => return,
            },
        };
        let path = format!("/api/agents/{target}/cancel");
        if Self::ask(world, report, node, "POST", &path, None).is_some() {
            self.open_jobs.retain(|(_, o)| *o != target);
        }
    }

    fn job(&mut self, world: &World, report: &mut Report, node: usize) {
        let owner = self.name();
        // The owner runs on the node the job is started through.
        let body = json!({"name": owner, "argv": agent(&["--hang"]), "await_ready": true,
                          "placement": {"labels": {"zone": world.nodes[node].zone()}}});
        if self.create(world, report, node, body).is_none() {
            return;
        }
        let id = format!("{owner}j");
        let body = json!({"id": id, "owner": owner, "instruction": "say {t}",
                          "input": "t\nalpha\nbeta\ngamma\ndelta\n", "concurrency": 2,
                          "worker": {"argv": agent(&["--job-worker"])}});
        if Self::ask(world, report, node, "POST", "/api/jobs", Some(&body)).is_none() {
            return;
        }
        report.jobs += 1;
        self.jobs.push((id.clone(), owner.clone()));
        self.open_jobs.push((id.clone(), owner));
        let path = format!("/api/jobs/{id}/start");
        Self::ask(world, report, node, "POST", &path, None);
    }

    fn failing_root(&mut self, world: &World, rng: &mut Rng, report: &mut Report, node: usize) {
        let name = self.name();
        let argv = match rng.below(3) {
            0 => agent(&["--crash"]),
            1 => agent(&["--error", "the root failed on purpose"]),
            _ => agent(&["--no-result", "--exit", "7"]),
        };
        if self
            .create(world, report, node, json!({"name": name, "argv": argv}))
            .is_some()
        {
            report.trees += 1;
        }
    }

    fn hanging_tree(&mut self, world: &World, rng: &mut Rng, report: &mut Report, node: usize) {
        let name = self.name();
        let child = json!({"name": format!("{name}-h"), "argv": agent(&["--hang", "--grandchildren", "1"])});
        let argv = agent(&[
            "--spawn-n",
            &format!("{}:{child}", rng.between(1, 3)),
            "--tolerate-refusal",
            "--hang",
        ]);
        if self
            .create(
                world,
                report,
                node,
                json!({"name": name.clone(), "argv": argv}),
            )
            .is_some()
        {
            report.trees += 1;
            self.hanging.push(name);
        }
    }

    /// Every root cancelled, through any node that answers.
    pub fn cancel_all(&self, world: &World, report: &mut Report) {
        let usable = world.usable();
        if usable.is_empty() {
            return;
        }
        for (i, name) in self.roots.iter().enumerate() {
            let node = usable[i % usable.len()];
            let path = format!("/api/agents/{name}/cancel");
            Self::ask(world, report, node, "POST", &path, None);
        }
    }
}
